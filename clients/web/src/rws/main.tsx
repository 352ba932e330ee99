/**
 * react-use-websocket 4.13.0 with the configuration a typical app uses, unchanged: the
 * heartbeat option `{ message: JSON.stringify({ action: 'heartbeat' }), returnMessage: 'pong',
 * timeout, interval }` (every 30 s by default), reconnect on every close, and a full-jitter
 * `reconnectInterval` (2 s base, 20 s cap).
 * It proves the API works with a third-party client: the text `pong` is filtered out of
 * `lastMessage` and keeps the connection alive; when a region degrades, its canary closes the
 * connections and the hook reconnects through the failover name to the other region.
 *
 * Query string: `user`, `auction`, `interval` and `timeout` (the heartbeat's, ms; default
 * 30000 / 35000). The token goes in the query string (`?token=`), fetched for every
 * connection along with the URL: react-use-websocket calls an async URL function per attempt.
 */
import { StrictMode, useCallback, useEffect, useRef, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { ReadyState } from 'react-use-websocket';
// The package is CommonJS with `exports.default` and `__esModule`; in an ES-module package
// ("type": "module") Vite 8's bundler follows Node and makes the default import the whole
// `module.exports` object ("useWebSocket is not a function"). Its own module exports the
// hook by name: the same code, imported without the interop guess.
import { useWebSocket } from 'react-use-websocket/dist/lib/use-websocket';

import { idParameter, msParameter, resolveUrl } from '../demo/local.js';

const params = new URLSearchParams(location.search);
const user = idParameter(params, 'user', 'rws-user');
const auction = idParameter(params, 'auction', 'a1');
const interval = msParameter(params, 'interval', 30000);
const timeout = msParameter(params, 'timeout', 35000);

/** What the browser test reads (window.rws), next to what the page shows. */
interface Observed {
  readyState: number;
  opens: number;
  closes: number;
  closeCodes: number[];
  /** `pong` frames the socket received (seen in onMessage, before the hook's filter). */
  rawPongs: number;
  /** Every value lastMessage took, in order. */
  lastMessages: string[];
  regions: string[];
  region: string | null;
  highest: number | null;
}

const observed: Observed = {
  readyState: -1,
  opens: 0,
  closes: 0,
  closeCodes: [],
  rawPongs: 0,
  lastMessages: [],
  regions: [],
  region: null,
  highest: null,
};
(window as unknown as { rws: Observed }).rws = observed;

async function socketUrl(): Promise<string> {
  const [url, token] = await Promise.all([
    resolveUrl(),
    fetch(`/token?user=${encodeURIComponent(user)}`, { cache: 'no-store' })
      .then((response) => response.json() as Promise<{ token: string }>)
      .then((body) => body.token),
  ]);
  const withToken = new URL(url);
  withToken.searchParams.set('token', token);
  return withToken.toString();
}

const STATES: Record<number, string> = {
  [ReadyState.UNINSTANTIATED]: 'uninstantiated',
  [ReadyState.CONNECTING]: 'connecting',
  [ReadyState.OPEN]: 'open',
  [ReadyState.CLOSING]: 'closing',
  [ReadyState.CLOSED]: 'closed',
};

function App() {
  const [region, setRegion] = useState<string | null>(null);
  const [highest, setHighest] = useState<number | null>(null);
  const [log, setLog] = useState<string[]>([]);
  const note = useCallback((line: string) => {
    setLog((lines) => [`${new Date().toISOString().slice(11, 23)} ${line}`, ...lines].slice(0, 50));
  }, []);
  const getUrl = useCallback(socketUrl, []);

  const { sendJsonMessage, lastMessage, readyState } = useWebSocket(getUrl, {
    // The configuration a typical app uses.
    shouldReconnect: () => true,
    reconnectAttempts: 1000,
    reconnectInterval: (attempt) => {
      const expDelay = Math.min(2000 * Math.pow(2, attempt), 20000);
      return Math.random() * expDelay;
    },
    heartbeat: {
      message: JSON.stringify({ action: 'heartbeat' }),
      returnMessage: 'pong',
      timeout,
      interval,
    },
    // Observation only.
    onOpen: () => {
      observed.opens += 1;
      note('open');
    },
    onClose: (event) => {
      observed.closes += 1;
      observed.closeCodes.push(event.code);
      note(`closed (${event.code})`);
    },
    onMessage: (event) => {
      if (event.data === 'pong') observed.rawPongs += 1;
    },
  });

  // After every (re)connect, ask for the state: a reconnect must restore what the page shows.
  useEffect(() => {
    observed.readyState = readyState;
    if (readyState === ReadyState.OPEN) {
      sendJsonMessage({ action: 'getState', auction });
    }
  }, [readyState, sendJsonMessage]);

  const seen = useRef<MessageEvent | null>(null);
  useEffect(() => {
    if (lastMessage === null || lastMessage === seen.current) return;
    seen.current = lastMessage;
    const data = String(lastMessage.data);
    observed.lastMessages.push(data);
    try {
      const reply = JSON.parse(data) as { region?: unknown; type?: unknown; auction?: { highest?: unknown } };
      if (typeof reply.region === 'string') {
        observed.region = reply.region;
        if (observed.regions.at(-1) !== reply.region) observed.regions.push(reply.region);
        setRegion(reply.region);
      }
      if (reply.type === 'state' && typeof reply.auction?.highest === 'number') {
        observed.highest = reply.auction.highest;
        setHighest(reply.auction.highest);
      }
    } catch {
      // Not JSON: shown as is below.
    }
  }, [lastMessage]);

  return (
    <main style={{ fontFamily: 'system-ui, sans-serif', maxWidth: 720, margin: '0 auto', padding: 16 }}>
      <h1>react-use-websocket 4.13.0 · a typical app's configuration</h1>
      <p>
        user <b id="user">{user}</b>, heartbeat every {interval} ms, timeout {timeout} ms
      </p>
      <dl>
        <dt>readyState</dt>
        <dd id="ready-state" data-value={readyState}>
          {STATES[readyState] ?? readyState}
        </dd>
        <dt>Serving region</dt>
        <dd id="region">{region ?? '–'}</dd>
        <dt>Highest bid on {auction}</dt>
        <dd id="highest">{highest ?? '–'}</dd>
        <dt>lastMessage</dt>
        <dd>
          <code id="last-message">{lastMessage === null ? '–' : String(lastMessage.data)}</code>
        </dd>
      </dl>
      <ol id="log">
        {log.map((line, index) => (
          <li key={log.length - index}>{line}</li>
        ))}
      </ol>
    </main>
  );
}

const root = document.getElementById('root');
if (root === null) throw new Error('#root missing');
createRoot(root).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
