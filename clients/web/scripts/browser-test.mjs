#!/usr/bin/env node
// Drives Debian's Chromium (through playwright-core; never a browser download) against the
// demo pages served by LocalRegions, and prints one JSON report as its last line of output.
// tests/e2e/test_web_browser.py starts LocalRegions, runs this and asserts on the report.
//
//   node scripts/browser-test.mjs failover --base-url http://127.0.0.1:PORT --artifacts DIR
//   node scripts/browser-test.mjs react-use-websocket --base-url ... --artifacts DIR
//
// failover: two bidders (two pages), each bid seen by the other; the primary region is
// throttled (POST /fail?mode=throttled); both pages must reconnect to the secondary with the
// highest bid intact, bid there, and come back after POST /restore and a reconnect.
// react-use-websocket: a typical app's configuration against the API, healthy (pong filtered out
// of lastMessage, stays open) and degraded (the primary throttled: it ends up on the secondary).
// Exit status 0 when every step passed; the report says which step failed otherwise.

import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

const CHROMIUM = process.env.STREAMFLEET_CHROMIUM ?? '/usr/bin/chromium';
// The flags this machine needs: no sandbox as root, no GPU, and no background connections
// (the network is closed; Chromium would otherwise keep trying to reach Google's hosts).
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];
const PRIMARY = 'us-east-1';
const SECONDARY = 'us-west-2';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    'base-url': { type: 'string' },
    artifacts: { type: 'string' },
    'timeout-ms': { type: 'string', default: '45000' },
  },
});
const scenario = positionals[0];
const baseUrl = values['base-url']?.replace(/\/$/, '');
if (!['failover', 'react-use-websocket'].includes(scenario ?? '') || !baseUrl || !values.artifacts) {
  console.error(
    'usage: browser-test.mjs failover|react-use-websocket --base-url URL --artifacts DIR [--timeout-ms N]',
  );
  process.exit(2);
}
const artifacts = resolve(values.artifacts);
const timeoutMs = Number(values['timeout-ms']);

const started = Date.now();
const report = { scenario, ok: false, steps: [], screenshots: [], console: [], pageErrors: [], observed: {} };
const elapsed = () => Date.now() - started;
const step = (name, extra = {}) => {
  report.steps.push({ step: name, atMs: elapsed(), ...extra });
  console.log(
    `[${(elapsed() / 1000).toFixed(2)} s] ${name}${Object.keys(extra).length ? ` ${JSON.stringify(extra)}` : ''}`,
  );
};

async function post(path) {
  const response = await fetch(`${baseUrl}${path}`, { method: 'POST' });
  if (!response.ok) throw new Error(`POST ${path}: HTTP ${response.status} ${await response.text()}`);
}

async function health() {
  const response = await fetch(`${baseUrl}/health`, { cache: 'no-store' });
  return response.json();
}

async function until(what, predicate, limitMs = timeoutMs) {
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
  step(`screenshot ${name}.png`);
}

function watch(page, label) {
  page.on('console', (message) => {
    if (['error', 'warning'].includes(message.type()) && report.console.length < 100) {
      report.console.push(`${label} ${message.type()}: ${message.text()}`);
    }
  });
  page.on('pageerror', (error) => report.pageErrors.push(`${label}: ${error.message}`));
}

// --- The live-auction page (StreamFleetClient) --------------------------------------------

/** What the person sees on the auction page, read from the DOM. */
function readAuction(page) {
  return page.evaluate(() => {
    const text = (id) => document.getElementById(id)?.textContent ?? '';
    const data = (id, key) => document.getElementById(id)?.dataset[key] ?? '';
    const highest = data('highest', 'value');
    return {
      region: data('region', 'value'),
      status: data('status', 'status'),
      ready: data('status', 'ready') === 'true',
      statusText: text('status'),
      highest: highest === '' ? null : Number(highest),
      attempts: Number(data('attempts', 'value')),
      connections: Number(text('connections')),
      forced: Number(text('forced')),
      bidResult: text('bid-result'),
      bidAccepted: data('bid-result', 'accepted'),
      log: [...document.querySelectorAll('#log li')].map((li) => li.textContent).reverse(),
    };
  });
}

async function connectedTo(page, region, what) {
  return until(what, async () => {
    const seen = await readAuction(page);
    return seen.ready && seen.region === region ? seen : null;
  });
}

async function showsHighest(page, amount, what) {
  return until(what, async () => {
    const seen = await readAuction(page);
    return seen.highest === amount ? seen : null;
  });
}

async function bid(page, who) {
  const before = await readAuction(page);
  const amount = before.highest + 10;
  await page.click('#bid-button');
  const after = await until(`${who}'s bid of ${amount} to be answered`, async () => {
    const seen = await readAuction(page);
    return seen.bidResult.includes(`${amount}`) ? seen : null;
  });
  if (after.bidAccepted !== 'true')
    throw new Error(`${who}'s bid of ${amount} was not accepted: ${after.bidResult}`);
  step(`${who} bid ${amount}: accepted`, { region: after.region });
  return amount;
}

async function failover(context) {
  // Compressed timings (the production ones are 30 s / 35 s, 2 s / 20 s): heartbeat every
  // 400 ms with a 600 ms timeout, backoff base 200 ms, the auction re-read every 300 ms.
  const auction = `auction-${Math.random().toString(36).slice(2, 8)}`;
  const query = `auction=${auction}&hb=400&hbTimeout=600&backoffBase=200&backoffCap=2000&poll=300`;
  const alice = await context.newPage();
  const bob = await context.newPage();
  watch(alice, 'alice');
  watch(bob, 'bob');
  await alice.setViewportSize({ width: 800, height: 900 });
  await alice.goto(`${baseUrl}/index.html?user=alice&${query}`);
  await bob.goto(`${baseUrl}/index.html?user=bob&${query}`);
  await connectedTo(alice, PRIMARY, `alice's page connected to ${PRIMARY}`);
  await connectedTo(bob, PRIMARY, `bob's page connected to ${PRIMARY}`);
  step('both pages connected', { region: PRIMARY, auction });

  const first = await bid(alice, 'alice');
  await showsHighest(bob, first, `bob's page to show alice's bid of ${first}`);
  step("bob's page shows alice's bid", { highest: first });
  const second = await bid(bob, 'bob');
  await showsHighest(alice, second, `alice's page to show bob's bid of ${second}`);
  step("alice's page shows bob's bid", { highest: second });
  const before = await readAuction(alice);
  await screenshot(alice, 'auction-before-failover');

  const beforeFailure = await readAuction(alice);
  const failedAt = elapsed();
  await post('/fail?mode=throttled');
  step('primary failed (throttled)');
  // Noticed: seen not ready, or already connected again (the canary closed the connection and
  // the page reconnected to the secondary between two of these reads, on a fast machine).
  const lost = await until('alice to notice the failure', async () => {
    const seen = await readAuction(alice);
    const reconnected = seen.connections > beforeFailure.connections || seen.region !== PRIMARY;
    return !seen.ready || reconnected ? seen : null;
  });
  step('alice noticed', { status: lost.status, afterMs: elapsed() - failedAt });
  const after = await connectedTo(alice, SECONDARY, `alice's page to reconnect to ${SECONDARY}`);
  step('alice reconnected to the secondary', { afterMs: elapsed() - failedAt, highest: after.highest });
  const bobAfter = await connectedTo(bob, SECONDARY, `bob's page to reconnect to ${SECONDARY}`);
  step('bob reconnected to the secondary', { afterMs: elapsed() - failedAt, highest: bobAfter.highest });
  const failedOverMs = elapsed() - failedAt;
  await screenshot(alice, 'auction-after-failover');

  const third = await bid(alice, 'alice');
  await showsHighest(bob, third, `bob's page to show alice's bid on the secondary`);
  step("bob's page shows alice's bid on the secondary", { highest: third });

  const restoredAt = elapsed();
  await post('/restore');
  await until(
    `the failover name to resolve to ${PRIMARY} again`,
    async () => (await health()).serving === PRIMARY,
  );
  step('primary restored: the failover name resolves to it', { afterMs: elapsed() - restoredAt });
  // Nothing is wrong with the secondary, so the pages stay there until they reconnect (as a
  // client does after API Gateway's 2-hour limit); the button does what that would do.
  await alice.click('#reconnect-button');
  await bob.click('#reconnect-button');
  const back = await connectedTo(alice, PRIMARY, `alice's page back on ${PRIMARY}`);
  const bobBack = await connectedTo(bob, PRIMARY, `bob's page back on ${PRIMARY}`);
  step('both pages back on the primary', { highest: back.highest });
  await screenshot(alice, 'auction-after-restore');

  report.observed = {
    auction,
    bids: [first, second, third],
    before: { region: before.region, highest: before.highest },
    afterFailover: {
      region: after.region,
      highest: after.highest,
      attempts: after.attempts,
      connections: after.connections,
      forced: after.forced,
    },
    bobAfterFailover: { region: bobAfter.region, highest: bobAfter.highest },
    afterRestore: { region: back.region, highest: back.highest, bobHighest: bobBack.highest },
    failedOverMs,
    aliceLog: (await readAuction(alice)).log,
    bobLog: (await readAuction(bob)).log,
  };
}

// --- react-use-websocket with a typical app's configuration ---------------------------------

const readRws = (page) =>
  page.evaluate(() => ({
    ...window.rws,
    lastMessageShown: document.getElementById('last-message')?.textContent,
  }));

async function reactUseWebSocket(context) {
  // Its heartbeat, compressed in time only: interval 500 ms, timeout 1500 ms.
  const interval = 500;
  const timeout = 1500;
  const page = await context.newPage();
  watch(page, 'rws');
  await page.goto(`${baseUrl}/react-use-websocket.html?user=carol&interval=${interval}&timeout=${timeout}`);
  await until(`react-use-websocket open on ${PRIMARY}`, async () => {
    const seen = await readRws(page);
    return seen.readyState === 1 && seen.region === PRIMARY ? seen : null;
  });
  step('react-use-websocket open', { region: PRIMARY });

  // Healthy: it sends heartbeats, the server answers `pong`, the hook filters it out of
  // lastMessage and stays open well past the heartbeat timeout.
  const healthyFor = 4 * timeout;
  await new Promise((r) => setTimeout(r, healthyFor));
  const healthy = await readRws(page);
  step('healthy phase over', {
    forMs: healthyFor,
    rawPongs: healthy.rawPongs,
    opens: healthy.opens,
    closes: healthy.closes,
    readyState: healthy.readyState,
  });
  await screenshot(page, 'react-use-websocket-healthy');

  const failedAt = elapsed();
  await post('/fail?mode=throttled');
  step('primary failed (throttled)');
  const moved = await until(`react-use-websocket to end up on ${SECONDARY}`, async () => {
    const seen = await readRws(page);
    return seen.readyState === 1 && seen.region === SECONDARY ? seen : null;
  });
  step('react-use-websocket reconnected to the secondary', {
    afterMs: elapsed() - failedAt,
    closes: moved.closes,
  });
  await screenshot(page, 'react-use-websocket-after-failover');
  await post('/restore');
  await until(
    `the failover name to resolve to ${PRIMARY} again`,
    async () => (await health()).serving === PRIMARY,
  );
  step('primary restored');

  report.observed = {
    healthyForMs: healthyFor,
    healthy: {
      readyState: healthy.readyState,
      opens: healthy.opens,
      closes: healthy.closes,
      rawPongs: healthy.rawPongs,
      pongsInLastMessage: healthy.lastMessages.filter((m) => m === 'pong').length,
      lastMessages: healthy.lastMessages.length,
      lastMessageShown: healthy.lastMessageShown,
    },
    degraded: {
      readyState: moved.readyState,
      region: moved.region,
      regions: moved.regions,
      opens: moved.opens,
      closes: moved.closes,
      closeCodes: moved.closeCodes,
      errorFrames: moved.lastMessages.filter((m) => m.includes('Internal server error')).length,
      pongsInLastMessage: moved.lastMessages.filter((m) => m === 'pong').length,
      highest: moved.highest,
      afterMs: elapsed() - failedAt,
    },
  };
}

// --- Main ---------------------------------------------------------------------------------

await mkdir(artifacts, { recursive: true });
const profile = await mkdtemp(join(tmpdir(), 'streamfleet-chromium-'));
let context;
let exitCode = 1;
try {
  // A persistent context is how playwright takes a --user-data-dir: a fresh one every run.
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 800, height: 900 },
  });
  report.browser = context.browser()?.version() ?? 'chromium';
  step('chromium started', { executable: CHROMIUM });
  await (scenario === 'failover' ? failover(context) : reactUseWebSocket(context));
  report.ok = true;
  exitCode = 0;
} catch (error) {
  report.error = error instanceof Error ? `${error.message}` : String(error);
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
  await context?.close().catch(() => undefined);
  await rm(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(report));
process.exit(exitCode);
