// dynalite as the tests and the local mode run it.
//
// dynalite's request handler rethrows a request's 'error' event, so a client that dies in the
// middle of a request (exactly what kill -9 of a worker does) takes the whole server down with
// ECONNRESET. A real DynamoDB shrugs that off; so does this wrapper: such errors end only that
// request. Any other uncaught error still stops the process.
//
// Usage: node tools/dynalite-server.js --host 127.0.0.1 --port 4567 [--path DIR]
"use strict";

const dynalite = require("dynalite");

function option(name, fallback) {
  const index = process.argv.indexOf(`--${name}`);
  return index >= 0 && index + 1 < process.argv.length ? process.argv[index + 1] : fallback;
}

const CLIENT_GONE = new Set(["ECONNRESET", "EPIPE", "ECONNABORTED"]);
process.on("uncaughtException", (err) => {
  if (err && (CLIENT_GONE.has(err.code) || err.message === "aborted")) {
    return; // a client went away mid-request: that request is over, the server is not
  }
  console.error(err);
  process.exit(1);
});

const server = dynalite({
  path: option("path", undefined),
  createTableMs: 0,
  deleteTableMs: 0,
  updateTableMs: 0,
});
const host = option("host", "127.0.0.1");
const port = Number(option("port", "4567"));
// Port 0: the system picks a free one, reported here (never chosen, released and bound again).
server.listen(port, host, () =>
  console.log(`dynalite listening at http://${host}:${server.address().port}`),
);

// A stop (SIGTERM) lets the requests in flight finish before the process exits: dynalite writes
// an item's index entries and the item itself in separate steps, and a process killed between
// the two leaves an index naming values the item no longer has, for good (an orphaned stream
// that no index query finds), which DynamoDB never does. Requests that arrive meanwhile are cut
// before dynalite reads them: to their clients, the server went down.
let inFlight = 0;
let stopping = false;
function exitWhenIdle() {
  if (stopping && inFlight === 0) {
    server.closeAllConnections();
    process.exit(0);
  }
}
server.prependListener("request", (request, response) => {
  if (stopping) {
    request.socket.destroy();
    return;
  }
  inFlight += 1;
  response.on("close", () => {
    inFlight -= 1;
    exitWhenIdle();
  });
});
process.on("SIGTERM", () => {
  stopping = true;
  server.close();
  server.closeIdleConnections();
  exitWhenIdle();
});
