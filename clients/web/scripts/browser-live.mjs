#!/usr/bin/env node
// Debian's Chromium (through playwright-core) holding demo pages open on their live-stream
// panel, steered over stdin by a Python harness (streamfleet_dev/wsapi/browser.py): one JSON
// command per line in, one JSON event per line out.
//
//   node scripts/browser-live.mjs --base-url http://127.0.0.1:PORT --artifacts DIR \
//        --pages '[{"user":"alice","stream":"live-001","query":"hb=400&hbTimeout=600"}]'
//
// Out: {"event":"ready","pages":N} once every page is loaded; then one answer per command:
//   {"cmd":"read"}                         -> {"event":"read","pages":[{user, stream, seqs, ...}]}
//   {"cmd":"offline","page":0,"ms":1500}   -> the page's network cut for ms (its own context)
//   {"cmd":"reload","page":0}              -> the page reloaded (positions in localStorage)
//   {"cmd":"watch","page":0,"stream":"x"}  -> the panel switched to another stream
//   {"cmd":"screenshot","page":0,"name":"x"} -> DIR/x.png
//   {"cmd":"quit"}                         -> {"event":"bye"}, exit 0
// Every page has a browser context of its own, so a network cut is one page's.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
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
  // Pages in background tabs must keep their timers (heartbeats, gap checks) on schedule.
  '--disable-background-timer-throttling',
  '--disable-renderer-backgrounding',
  '--disable-backgrounding-occluded-windows',
];

const { values } = parseArgs({
  options: {
    'base-url': { type: 'string' },
    artifacts: { type: 'string' },
    pages: { type: 'string' },
  },
});
const baseUrl = values['base-url']?.replace(/\/$/, '');
if (!baseUrl || !values.artifacts || !values.pages) {
  console.error('usage: browser-live.mjs --base-url URL --artifacts DIR --pages JSON');
  process.exit(2);
}
const artifacts = resolve(values.artifacts);
const wanted = JSON.parse(values.pages);
const out = (event) => console.log(JSON.stringify(event));

function readPage(page) {
  return page.evaluate(() => {
    const sf = window.streamfleet;
    const data = (id, key) => document.getElementById(id)?.dataset[key] ?? '';
    const client = sf?.client;
    const stream = data('stream-name', 'value');
    const cursor = client?.cursor(stream);
    return {
      user: sf?.user ?? null,
      stream,
      seqs: sf?.streams.seqs[stream] ?? [],
      startedAfter: sf?.streams.startedAfter[stream] ?? null,
      deliveredAtMs: sf?.streams.deliveredAtMs[stream] ?? [],
      allSeqs: sf?.streams.seqs ?? {},
      latenciesMs: sf?.streams.latenciesMs ?? [],
      region: client?.region ?? null,
      ready: client?.ready ?? false,
      connections: client?.snapshot().connections ?? 0,
      attempts: client?.snapshot().attempts ?? 0,
      gapResubscribes: cursor?.stats.gapResubscribes ?? 0,
      duplicates: cursor?.stats.duplicates ?? 0,
      position: client?.position(stream) ?? null,
      error: document.getElementById('stream-error')?.textContent ?? '',
      errorCode: data('stream-error', 'error'),
      shownLastSeq: data('stream-seq', 'value'),
    };
  });
}

const profile = await mkdtemp(join(tmpdir(), 'streamfleet-chromium-live-'));
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
const pages = [];
const errors = [];
let exitCode = 0;
try {
  for (const spec of wanted) {
    const context = await browser.newContext({ viewport: { width: 800, height: 1100 } });
    const page = await context.newPage();
    page.on('pageerror', (error) => errors.push(`${spec.user}: ${error.message}`));
    const query = new URLSearchParams(spec.query ?? '');
    query.set('user', spec.user);
    if (spec.stream) query.set('stream', spec.stream);
    await page.goto(`${baseUrl}/index.html?${query.toString()}`);
    pages.push({ spec, context, page });
  }
  out({ event: 'ready', pages: pages.length, browser: browser.version() });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const command = JSON.parse(line);
    const target = pages[command.page ?? 0];
    try {
      if (command.cmd === 'read') {
        out({ event: 'read', pages: await Promise.all(pages.map((p) => readPage(p.page))), errors });
      } else if (command.cmd === 'offline') {
        await target.context.setOffline(true);
        // Offline emulation stops new requests; an open WebSocket must be cut as a dead
        // network would cut it: from inside the page, without a close handshake.
        await target.page.evaluate(() => {
          for (const ws of window.streamfleet.sockets) ws.close(4001, 'network lost');
        });
        await new Promise((r) => setTimeout(r, command.ms ?? 1000));
        await target.context.setOffline(false);
        out({ event: 'online', page: command.page ?? 0 });
      } else if (command.cmd === 'reload') {
        await target.page.reload();
        out({ event: 'reloaded', page: command.page ?? 0 });
      } else if (command.cmd === 'watch') {
        await target.page.fill('#stream-id', command.stream);
        await target.page.click('#stream-watch');
        out({ event: 'watching', page: command.page ?? 0, stream: command.stream });
      } else if (command.cmd === 'screenshot') {
        const path = join(artifacts, `${command.name}.png`);
        await target.page.screenshot({ path, fullPage: true });
        out({ event: 'screenshot', path });
      } else if (command.cmd === 'quit') {
        out({ event: 'bye', errors });
        break;
      } else {
        out({ event: 'error', error: `unknown command ${command.cmd}` });
      }
    } catch (error) {
      out({ event: 'error', error: error instanceof Error ? error.message : String(error) });
    }
  }
} catch (error) {
  out({ event: 'failed', error: error instanceof Error ? error.message : String(error) });
  exitCode = 1;
} finally {
  await browser.close().catch(() => undefined);
  await rm(profile, { recursive: true, force: true });
}
process.exit(exitCode);
