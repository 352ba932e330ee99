#!/usr/bin/env node
// The web client's liveness in Debian's Chromium (through playwright-core), against the demo
// page served by LocalRegions, with the network cut by this script; prints one JSON report as
// its last line of output (tests/e2e/test_web_liveness.py asserts on it).
//
//   node scripts/browser-liveness.mjs dead-connection|online-wakes|rotation \
//        --base-url http://127.0.0.1:PORT --artifacts DIR
//
// The page reaches the API through a TCP proxy of this script (its /resolve answer is replaced
// by the proxy's URL), which can cut the network two ways: `freeze` keeps every connection open
// and silently drops what crosses it, as a dead network or a frozen server does (the browser's
// offline emulation does not touch an open WebSocket); `refuse` resets them and refuses new
// ones. Each cut also sets the browser context offline (so `online` fires when it comes back).
//
// dead-connection: default liveness settings; frozen; how long until the page drops the
//   connection (at most 30 s), then the network comes back and the page reconnects.
// online-wakes: a backoff of up to 30 s; refused until the page waits at least 10 s for its next
//   attempt; back online, the page reconnects at once, before that attempt was due.
// rotation: maxAge of 3 s; requests every 100 ms for several rotations: none fails, the
//   status never leaves `open` and the page is ready throughout.

import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

const CHROMIUM = process.env.STREAMFLEET_CHROMIUM ?? '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-background-timer-throttling',
  '--disable-renderer-backgrounding',
];
const SCENARIOS = ['dead-connection', 'online-wakes', 'rotation'];

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    'base-url': { type: 'string' },
    artifacts: { type: 'string' },
  },
});
const scenario = positionals[0];
const baseUrl = values['base-url']?.replace(/\/$/, '');
if (!SCENARIOS.includes(scenario ?? '') || !baseUrl || !values.artifacts) {
  console.error(`usage: browser-liveness.mjs ${SCENARIOS.join('|')} --base-url URL --artifacts DIR`);
  process.exit(2);
}
const artifacts = resolve(values.artifacts);

const started = Date.now();
const report = { scenario, ok: false, steps: [], screenshots: [], console: [], pageErrors: [], observed: {} };
const elapsed = () => Date.now() - started;
const step = (name, extra = {}) => {
  report.steps.push({ step: name, atMs: elapsed(), ...extra });
  console.log(
    `[${(elapsed() / 1000).toFixed(2)} s] ${name}${Object.keys(extra).length ? ` ${JSON.stringify(extra)}` : ''}`,
  );
};

/** Polls `predicate` every 100 ms until it returns something truthy, or fails after `limitMs`. */
async function until(what, predicate, limitMs) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${limitMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function screenshot(page, name) {
  const path = join(artifacts, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  report.screenshots.push(path);
}

// --- The network between the page and the API ---------------------------------------------

/** A TCP proxy to `target` (host:port) that can freeze (drop silently) or refuse. */
async function networkTo(target) {
  const [host, port] = [target.hostname, Number(target.port)];
  const pairs = new Set();
  let mode = 'open';
  const server = net.createServer((client) => {
    const pair = { client, upstream: null };
    pairs.add(pair);
    const end = () => {
      pairs.delete(pair);
      client.destroy();
      pair.upstream?.destroy();
    };
    client.on('error', end).on('close', end);
    if (mode === 'refuse') return end();
    if (mode === 'frozen') return; // accepted, never answered: a dead network
    pair.upstream = net.connect(port, host);
    pair.upstream.on('error', end).on('close', end);
    client.on('data', (data) => mode === 'open' && pair.upstream.write(data));
    pair.upstream.on('data', (data) => mode === 'open' && client.write(data));
  });
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  const destroyAll = () => {
    for (const pair of [...pairs]) {
      pair.client.destroy();
      pair.upstream?.destroy();
    }
    pairs.clear();
  };
  return {
    url: `ws://127.0.0.1:${server.address().port}`,
    connections: () => pairs.size,
    freeze: () => void (mode = 'frozen'),
    refuse: () => {
      mode = 'refuse';
      destroyAll();
    },
    // Whatever a cut left behind is gone when the network comes back, as after a real outage.
    restore: () => {
      destroyAll();
      mode = 'open';
    },
    close: () => {
      destroyAll();
      server.close();
    },
  };
}

// --- The page ------------------------------------------------------------------------------

/** Opens the demo page through `network`, with the client's events recorded in the page. */
async function openPage(context, network, query) {
  const region = await (await fetch(`${baseUrl}/resolve`)).json();
  await context.route('**/resolve', (route) => route.fulfill({ json: { ...region, url: network.url } }));
  const page = await context.newPage();
  page.on('console', (message) => {
    if (['error', 'warning'].includes(message.type()) && report.console.length < 100) {
      report.console.push(`${message.type()}: ${message.text()}`);
    }
  });
  page.on('pageerror', (error) => report.pageErrors.push(error.message));
  const user = `live-${Math.random().toString(36).slice(2, 8)}`;
  await page.goto(`${baseUrl}/index.html?user=${user}&${query}`);
  await until('the page to be ready', () => page.evaluate(() => window.streamfleet?.client.ready), 30_000);
  await page.evaluate(() => {
    const { client } = window.streamfleet;
    const seen = { disconnects: [], statuses: [], readyChanges: [], pongs: 0, onlineAt: null };
    let ready = client.ready;
    client.on('disconnect', (info) => seen.disconnects.push({ ...info, at: Date.now() }));
    client.on('status', (status) => seen.statuses.push({ status, at: Date.now() }));
    client.on('pong', () => (seen.pongs += 1));
    client.on('change', (snapshot) => {
      if (snapshot.ready !== ready)
        seen.readyChanges.push({ ready: (ready = snapshot.ready), at: Date.now() });
    });
    window.addEventListener('online', () => (seen.onlineAt = Date.now()));
    window.liveness = seen;
  });
  step('page ready', { user, region: region.region });
  return page;
}

const read = (page) =>
  page.evaluate(() => ({
    ...window.liveness,
    snapshot: (({ state, ...rest }) => rest)(window.streamfleet.client.snapshot()),
    ready: window.streamfleet.client.ready,
    // nextAttemptAt is on the client's clock (performance.now()): the time left, in ms.
    nextAttemptInMs:
      window.streamfleet.client.snapshot().nextAttemptAt === null
        ? null
        : window.streamfleet.client.snapshot().nextAttemptAt - performance.now(),
    openSockets: window.streamfleet.sockets.size,
    now: Date.now(),
  }));

async function deadConnection(context, network) {
  const page = await openPage(context, network, 'poll=600000');
  await screenshot(page, 'dead-connection-before');
  const cutAt = Date.now();
  network.freeze();
  await context.setOffline(true);
  step('network frozen: the socket stays open, nothing crosses it');
  // The bound is 30 s; ten times that before giving up.
  const noticed = await until(
    'the page to drop the dead connection',
    async () => {
      const seen = await read(page);
      return seen.disconnects.length > 0 ? seen : null;
    },
    300_000,
  );
  const detectedMs = noticed.disconnects[0].at - cutAt;
  step('the page dropped the dead connection', { detectedMs, reason: noticed.disconnects[0].reason });
  await screenshot(page, 'dead-connection-noticed');
  const backAt = Date.now();
  network.restore();
  await context.setOffline(false);
  const back = await until(
    'the page to reconnect',
    async () => {
      const seen = await read(page);
      return seen.ready ? seen : null;
    },
    120_000,
  );
  step('the page reconnected', { afterMs: back.now - backAt });
  await screenshot(page, 'dead-connection-reconnected');
  report.observed = {
    detectedMs,
    disconnect: noticed.disconnects[0],
    statusWhileFrozen: noticed.statuses.map((s) => s.status),
    reconnectedAfterMs: back.now - backAt,
    connections: back.snapshot.connections,
    forcedReconnects: back.snapshot.forcedReconnects,
  };
}

async function onlineWakes(context, network) {
  const page = await openPage(context, network, 'poll=600000&backoffBase=30000&backoffCap=30000');
  network.refuse();
  await context.setOffline(true);
  step('network cut: connections reset, new ones refused');
  // Each failed attempt waits random() * 30 s: go on until one waits long enough to tell.
  const waiting = await until(
    'a backoff of at least 10 s',
    async () => {
      const seen = await read(page);
      return seen.snapshot.status === 'backing-off' && seen.nextAttemptInMs > 10_000 ? seen : null;
    },
    300_000,
  );
  step('backing off', { nextAttemptInMs: Math.round(waiting.nextAttemptInMs) });
  await screenshot(page, 'online-wakes-backing-off');
  const dueAt = waiting.now + waiting.nextAttemptInMs;
  const attemptsBefore = waiting.snapshot.attempts;
  network.restore();
  await context.setOffline(false);
  const back = await until(
    'the page to reconnect',
    async () => {
      const seen = await read(page);
      return seen.ready ? seen : null;
    },
    60_000,
  );
  const readyAt = back.readyChanges.at(-1).at;
  step('the page reconnected', { afterOnlineMs: readyAt - back.onlineAt, msBeforeDue: dueAt - readyAt });
  await screenshot(page, 'online-wakes-reconnected');
  report.observed = {
    scheduledInMs: waiting.nextAttemptInMs,
    reconnectedAfterOnlineMs: readyAt - back.onlineAt,
    reconnectedBeforeDue: readyAt < dueAt,
    msBeforeDue: dueAt - readyAt,
    attemptsAfterOnline: back.snapshot.attempts - attemptsBefore,
  };
}

async function rotation(context, network) {
  const page = await openPage(context, network, 'poll=600000&maxAge=3000');
  const firstConnections = (await read(page)).snapshot.connections;
  // Requests all along, as an application makes them: none may fail across a rotation.
  await page.evaluate(() => {
    const { client, auction } = window.streamfleet;
    const requests = (window.liveness.requests = { ok: 0, failed: [] });
    window.liveness.timer = setInterval(() => {
      client.getState({ auction }).then(
        () => (requests.ok += 1),
        (error) => requests.failed.push(`${error.name}: ${error.message}`),
      );
    }, 100);
  });
  step('requests every 100 ms');
  const rotated = await until(
    'four rotations',
    async () => {
      const seen = await read(page);
      return seen.snapshot.connections >= firstConnections + 4 ? seen : null;
    },
    120_000,
  );
  // The last requests answered too.
  await page.evaluate(() => clearInterval(window.liveness.timer));
  await new Promise((r) => setTimeout(r, 1500));
  const done = await page.evaluate(() => window.liveness.requests);
  step('rotated', {
    connections: rotated.snapshot.connections,
    requests: done.ok,
    failed: done.failed.length,
  });
  await screenshot(page, 'rotation');
  report.observed = {
    rotations: rotated.snapshot.connections - firstConnections,
    statuses: rotated.statuses.map((s) => s.status),
    readyChanges: rotated.readyChanges,
    disconnects: rotated.disconnects,
    requestsOk: done.ok,
    requestsFailed: done.failed,
    openSockets: rotated.openSockets,
    attempts: rotated.snapshot.attempts,
  };
}

// --- Main ---------------------------------------------------------------------------------

await mkdir(artifacts, { recursive: true });
const profile = await mkdtemp(join(tmpdir(), 'streamfleet-chromium-liveness-'));
let context;
let network;
let exitCode = 1;
try {
  const served = await (await fetch(`${baseUrl}/resolve`)).json();
  network = await networkTo(new URL(served.url));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 800, height: 900 },
  });
  report.browser = context.browser()?.version() ?? 'chromium';
  step('chromium started', { proxy: network.url, to: served.url });
  const run = { 'dead-connection': deadConnection, 'online-wakes': onlineWakes, rotation }[scenario];
  await run(context, network);
  report.ok = true;
  exitCode = 0;
} catch (error) {
  report.error = error instanceof Error ? error.message : String(error);
  step(`FAILED: ${report.error}`);
  for (const [index, page] of (context?.pages() ?? []).entries()) {
    try {
      await screenshot(page, `failure-page-${index + 1}`);
    } catch {
      // The page may be gone: the report says what failed.
    }
  }
} finally {
  report.totalMs = elapsed();
  network?.close();
  await context?.close().catch(() => undefined);
  await rm(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(report));
process.exit(exitCode);
