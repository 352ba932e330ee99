"""The integration test of both Regions on a real account (``make integ``, see integ/README.md).

``settings``: what the run needs from the tester, read from a JSON context file;
``build``: the stacks under test (built by ``app.py``'s own code) and the assertions;
``probe``: the Lambda that STARTs a stream with a signed request and subscribes to it;
``preflight``: what ``make integ`` checks before anything is synthesized or deployed;
``run``: ``make integ`` itself: synthesize, deploy, report the assertions, destroy.
"""
