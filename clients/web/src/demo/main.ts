/**
 * A live auction demo. Everyone bids on the same item; the page shows the
 * current highest bid, the region that served the last reply, the connection state and the
 * reconnect attempts, so a regional failover can be watched as it happens.
 *
 * Query string: `user` (the bidder; default a random one, kept in the URL so a reload keeps
 * it), `auction` (default `a1`), and, to compress the timings for tests and demos, `hb` and
 * `hbTimeout` (heartbeat quiet period and pong timeout, ms; default 20000 / 10000), `maxAge`
 * (rotate the connection at 90 to 100 % of this age, ms; default 6600000), `backoffBase` and
 * `backoffCap` (ms; default 2000 / 20000), `poll` (how often to refresh the highest bid from
 * the server, ms; default 2000), `gap` (how long a gap in a watched stream may stay open before
 * the stored log is asked, ms; default 2000), and `stream` (watch this stream in the live-stream
 * panel, see stream-panel.ts).
 */
import './style.css';

import {
  type BidReply,
  type ClientSnapshot,
  ServerError,
  type StateReply,
  StreamFleetClient,
  storagePositions,
} from '@streamfleet/web-client';
import { idParameter, msParameter, resolveUrl, tokenProvider } from './local.js';
import { mountStreamPanel } from './stream-panel.js';

const BID_STEP = 10;
const LOG_LINES = 200;

function element<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (found === null) throw new Error(`#${id} missing from the page`);
  return found as T;
}

const view = {
  auction: element('auction-name'),
  user: element('user'),
  highest: element('highest'),
  highestBy: element('highest-by'),
  form: element<HTMLFormElement>('bid-form'),
  amount: element<HTMLInputElement>('bid-amount'),
  bidButton: element<HTMLButtonElement>('bid-button'),
  bidResult: element('bid-result'),
  region: element('region'),
  status: element('status'),
  attempts: element('attempts'),
  connections: element('connections'),
  forced: element('forced'),
  reconnect: element<HTMLButtonElement>('reconnect-button'),
  log: element<HTMLOListElement>('log'),
};

function log(text: string): void {
  const line = document.createElement('li');
  line.textContent = `${new Date().toISOString().slice(11, 23)} ${text}`;
  view.log.prepend(line);
  while (view.log.children.length > LOG_LINES) view.log.lastElementChild?.remove();
}

function randomUser(): string {
  return `bidder-${Math.random().toString(36).slice(2, 6)}`;
}

function main(): void {
  const params = new URLSearchParams(location.search);
  if (!params.has('user')) {
    params.set('user', randomUser());
    history.replaceState(null, '', `${location.pathname}?${params.toString()}`);
  }
  const user = idParameter(params, 'user', 'anonymous');
  const auction = idParameter(params, 'auction', 'a1');
  const pollMs = msParameter(params, 'poll', 2000);
  // The sockets this page has open, so that a browser test can cut them as a lost network would.
  const sockets = new Set<WebSocket>();
  const client = new StreamFleetClient({
    webSocket: (url, protocols) => {
      const ws = new WebSocket(url, protocols);
      sockets.add(ws);
      ws.addEventListener('close', () => sockets.delete(ws));
      return ws;
    },
    url: resolveUrl,
    token: tokenProvider(user),
    getStateFields: { auction },
    heartbeatIntervalMs: msParameter(params, 'hb', 20000),
    heartbeatTimeoutMs: msParameter(params, 'hbTimeout', 10000),
    maxConnectionAgeMs: msParameter(params, 'maxAge', 6_600_000),
    backoffBaseMs: msParameter(params, 'backoffBase', 2000),
    backoffCapMs: msParameter(params, 'backoffCap', 20000),
    gapTimeoutMs: msParameter(params, 'gap', 2000),
    // Per user: a reload resumes each stream after the last seq this browser showed.
    positions: storagePositions(localStorage, `streamfleet.${user}.position.`),
    name: 'page',
  });

  view.auction.textContent = auction;
  view.user.textContent = user;
  document.title = `${user} · live auction ${auction}`;
  let highest: number | null = null;

  function showHighest(amount: number, isYou: boolean): void {
    highest = amount;
    view.highest.textContent = amount.toLocaleString('en-US');
    view.highest.dataset.value = String(amount);
    view.highest.classList.remove('stale');
    view.highestBy.textContent = amount === 0 ? 'no bids yet' : isYou ? 'that is you' : 'by someone else';
    view.bidButton.textContent = `Bid ${(amount + BID_STEP).toLocaleString('en-US')}`;
  }

  function render(snapshot: ClientSnapshot): void {
    view.status.textContent = snapshot.ready ? 'connected' : snapshot.status;
    view.status.dataset.status = snapshot.status;
    view.status.dataset.ready = String(snapshot.ready);
    view.region.textContent = snapshot.region ?? '–';
    view.region.dataset.value = snapshot.region ?? '';
    view.attempts.textContent = String(snapshot.reconnectAttempt);
    view.attempts.dataset.value = String(snapshot.reconnectAttempt);
    view.connections.textContent = String(snapshot.connections);
    view.forced.textContent = String(snapshot.forcedReconnects);
    view.bidButton.disabled = !snapshot.ready || highest === null;
    // Keep showing the last known bid while reconnecting, greyed out.
    view.highest.classList.toggle('stale', !snapshot.ready && highest !== null);
  }

  function onState(reply: StateReply): void {
    if (reply.auction !== undefined && reply.auction.auction === auction) {
      showHighest(reply.auction.highest, reply.auction.highestIsYou);
      render(client.snapshot());
    }
  }

  client.on('change', render);
  client.on('state', onState);
  client.on('ready', (reply) =>
    log(`state restored from ${reply.region ?? '?'}: highest ${reply.auction?.highest ?? 0}`),
  );
  client.on('region', (region, previous) =>
    log(previous === null ? `served by ${region}` : `region changed: ${previous} → ${region}`),
  );
  client.on('status', (status) => {
    if (status === 'connecting') log(`connecting (attempt ${client.snapshot().attempts})`);
  });
  client.on('disconnect', (info) => {
    const why = info.forced ? info.reason : `closed${info.code === null ? '' : ` (${info.code})`}`;
    log(info.opened ? `connection lost: ${why}` : `connect failed: ${why}`);
  });
  client.on('reconnecting', ({ attempt, delayMs }) =>
    log(`reconnect attempt ${attempt} in ${Math.round(delayMs)} ms`),
  );
  client.on('error', (error) => log(`attempt failed: ${String(error)}`));

  view.form.addEventListener('submit', (event) => {
    event.preventDefault();
    const typed = view.amount.value.trim();
    const amount = typed === '' ? (highest ?? 0) + BID_STEP : Number(typed);
    view.bidButton.disabled = true;
    client
      .bid(auction, amount)
      .then((reply: BidReply) => {
        showHighest(reply.highest, reply.highestIsYou);
        view.bidResult.textContent = reply.accepted
          ? `your bid of ${amount} was accepted (${reply.region ?? '?'})`
          : `your bid of ${amount} was refused: ${reply.reason ?? 'not higher'}`;
        view.bidResult.dataset.accepted = String(reply.accepted);
        log(`bid ${amount}: ${reply.accepted ? 'accepted' : 'refused'} by ${reply.region ?? '?'}`);
        view.amount.value = '';
      })
      .catch((error: unknown) => {
        const text =
          error instanceof ServerError ? `${error.message} (${error.field ?? 'server'})` : String(error);
        view.bidResult.textContent = `bid not placed: ${text}`;
        view.bidResult.dataset.accepted = 'false';
        log(`bid ${amount} failed: ${text}`);
      })
      .finally(() => render(client.snapshot()));
  });

  view.reconnect.addEventListener('click', () => {
    log('reconnect requested');
    client.reconnect();
  });

  // Other bidders' bids: the API has no broadcast yet, so ask for the auction now and then.
  window.setInterval(() => {
    if (client.ready) client.getState({ auction }).catch(() => undefined);
  }, pollMs);

  // For the browser tests and for poking at it from the devtools console.
  const streams = mountStreamPanel(client, params);
  (window as unknown as { streamfleet: unknown }).streamfleet = { client, user, auction, streams, sockets };
  render(client.snapshot());
  client.start();
}

try {
  main();
} catch (error) {
  log(`cannot start: ${String(error)}`);
  element('status').textContent = 'not started';
  throw error;
}
