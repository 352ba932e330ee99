"""A deterministic simulation: the real code on a virtual clock, against in-process stores,
with every source of nondeterminism (time, randomness, the order of callbacks) drawn from a
seed, so that a seed replays the same schedule and the same outcome on any machine.
"""
