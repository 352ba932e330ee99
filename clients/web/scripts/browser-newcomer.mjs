#!/usr/bin/env node
// The newcomer's application (docs/clients.md's React example, built from the packed tarball
// by tests/e2e/test_web_newcomer.py) in Debian's Chromium through playwright-core, as
// browser-test.mjs drives the demo pages. It prints one JSON report as its last line.
//
//   node scripts/browser-newcomer.mjs --base-url http://127.0.0.1:PORT --artifacts DIR
//
// The page must show the stream (the status open, at least 5 messages, in seq order, each once),
// then after a reload go on after the last message it had delivered (localStorage), not from
// the start again. Exit status 0 when every step passed.

import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

const CHROMIUM = process.env.STREAMFLEET_CHROMIUM ?? '/usr/bin/chromium';
// As browser-test.mjs: no sandbox as root, no GPU, no background connections.
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

const { values } = parseArgs({
  options: {
    'base-url': { type: 'string' },
    artifacts: { type: 'string' },
    'timeout-ms': { type: 'string', default: '60000' },
  },
});
const baseUrl = values['base-url']?.replace(/\/$/, '');
if (!baseUrl || !values.artifacts) {
  console.error('usage: browser-newcomer.mjs --base-url URL --artifacts DIR [--timeout-ms N]');
  process.exit(2);
}
const artifacts = resolve(values.artifacts);
const timeoutMs = Number(values['timeout-ms']);
const started = Date.now();
const report = { ok: false, steps: [], console: [], pageErrors: [], observed: {} };
const step = (name, extra = {}) => {
  report.steps.push({ step: name, atMs: Date.now() - started, ...extra });
  console.log(`[${((Date.now() - started) / 1000).toFixed(2)} s] ${name} ${JSON.stringify(extra)}`);
};

async function until(what, predicate) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Where the example's client keeps the stream's position (storagePositions' default prefix). */
const POSITION_KEY = 'streamfleet.position.live-001';

/** What the person sees: the list's status and the seqs shown (`#<seq> <data>`). */
const read = (page) =>
  page.evaluate(() => {
    const list = document.querySelector('ol');
    const seqs = [...(list?.querySelectorAll('li') ?? [])].map((li) =>
      Number(/^#(\d+)/.exec(li.textContent)?.[1]),
    );
    return { status: list?.dataset.status ?? null, seqs };
  });

function inOrderOnce(seqs, what) {
  for (let i = 1; i < seqs.length; i += 1) {
    if (seqs[i] !== seqs[i - 1] + 1) throw new Error(`${what}: not consecutive at ${i}: ${seqs.join(',')}`);
  }
}

await mkdir(artifacts, { recursive: true });
const profile = await mkdtemp(join(tmpdir(), 'streamfleet-chromium-'));
let context;
let exitCode = 1;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 800, height: 900 },
  });
  const page = await context.newPage();
  page.on('console', (m) => {
    if (['error', 'warning'].includes(m.type()) && report.console.length < 100) {
      report.console.push(`${m.type()}: ${m.text()}`);
    }
  });
  page.on('pageerror', (error) => report.pageErrors.push(error.message));
  await page.goto(`${baseUrl}/index.html`);
  const before = await until('the page to show 5 messages, connected', async () => {
    const seen = await read(page);
    return seen.status === 'open' && seen.seqs.length >= 5 ? seen : null;
  });
  inOrderOnce(before.seqs, 'before the reload');
  step('streaming', { shown: before.seqs.length, last: before.seqs.at(-1) });
  await page.screenshot({ path: join(artifacts, 'newcomer.png'), fullPage: true });

  // Exact, however fast the stream: the position stored when the page went away, and the first
  // message the reloaded page rendered (before `keep` could trim it), both kept in the tab's
  // sessionStorage, which a reload keeps.
  await page.evaluate((key) => {
    addEventListener('pagehide', () => sessionStorage.setItem('unloadedAt', localStorage.getItem(key) ?? ''));
  }, POSITION_KEY);
  await page.addInitScript(() => {
    new MutationObserver((_, observer) => {
      const first = document.querySelector('ol li');
      if (first === null) return;
      sessionStorage.setItem('firstShown', /^#(\d+)/.exec(first.textContent)?.[1] ?? '');
      observer.disconnect();
    }).observe(document, { childList: true, subtree: true });
  });
  await page.reload();
  const after = await until('the reloaded page to show 3 messages', async () => {
    const seen = await read(page);
    return seen.status === 'open' && seen.seqs.length >= 3 ? seen : null;
  });
  inOrderOnce(after.seqs, 'after the reload');
  const resumed = await page.evaluate(() => ({
    unloadedAt: sessionStorage.getItem('unloadedAt'),
    firstShown: Number(sessionStorage.getItem('firstShown')),
  }));
  step('streaming after the reload', { first: after.seqs[0], last: after.seqs.at(-1), ...resumed });
  report.observed = { before: before.seqs, after: after.seqs, ...resumed };
  report.ok = true;
  exitCode = 0;
} catch (error) {
  report.error = error instanceof Error ? error.message : String(error);
  step(`FAILED: ${report.error}`);
  for (const page of context?.pages() ?? []) {
    await page.screenshot({ path: join(artifacts, 'failure.png'), fullPage: true }).catch(() => undefined);
  }
} finally {
  report.totalMs = Date.now() - started;
  await context?.close().catch(() => undefined);
  await rm(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(report));
process.exit(exitCode);
