/**
 * The demo's live-stream panel: pick a stream (an ingested connection of the fleet), watch its
 * messages arrive with their seqs, replayed from where this page left off and then live.
 *
 * The page's positions live in localStorage, so a reload resumes after the last seq it showed;
 * the server's state (getState's `subscriptions`) re-subscribes a reloaded page by itself.
 * `?stream=<id>` watches that stream at once. The choices come from `GET /streams` when the
 * local stand-in serves it (the streams the local fleet runs).
 */
import {
  type StreamFleetClient,
  type StreamMessage,
  SubscriptionRefusedError,
} from '@streamfleet/web-client';

const SHOWN_MESSAGES = 200;

function element<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (found === null) throw new Error(`#${id} missing from the page`);
  return found as T;
}

/** What the browser tests read: every seq delivered per stream, in delivery order. */
export interface StreamRecord {
  seqs: Record<string, number[]>;
  /** When each of `seqs` was delivered (epoch ms). */
  deliveredAtMs: Record<string, number[]>;
  latenciesMs: number[];
  /** The position each stream was watched from (a reloaded page: the one it had saved). */
  startedAfter: Record<string, number | null>;
}

export function mountStreamPanel(client: StreamFleetClient, params: URLSearchParams): StreamRecord {
  const view = {
    form: element<HTMLFormElement>('stream-form'),
    input: element<HTMLInputElement>('stream-id'),
    choices: element<HTMLDataListElement>('stream-choices'),
    name: element('stream-name'),
    seq: element('stream-seq'),
    count: element('stream-count'),
    gaps: element('stream-gaps'),
    latency: element('stream-latency'),
    error: element('stream-error'),
    list: element<HTMLOListElement>('stream-messages'),
  };
  const record: StreamRecord = { seqs: {}, deliveredAtMs: {}, latenciesMs: [], startedAfter: {} };
  let watching: string | null = null;

  function show(message: StreamMessage): void {
    (record.seqs[message.stream] ??= []).push(message.seq);
    (record.deliveredAtMs[message.stream] ??= []).push(Date.now());
    if (message.receivedAtMs !== null && message.source === 'live') {
      record.latenciesMs.push(Date.now() - message.receivedAtMs);
    }
    if (message.stream !== watching) return;
    const line = document.createElement('li');
    line.value = message.seq;
    line.className = message.source;
    const seq = document.createElement('span');
    seq.className = 'seq';
    seq.textContent = `#${message.seq}`;
    line.append(seq, document.createTextNode(message.data.slice(0, 160)));
    view.list.prepend(line);
    while (view.list.children.length > SHOWN_MESSAGES) view.list.lastElementChild?.remove();
    view.seq.textContent = String(message.seq);
    view.seq.dataset.value = String(message.seq);
    const count = record.seqs[message.stream]!.length;
    view.count.textContent = count.toLocaleString('en-US');
    view.count.dataset.value = String(count);
    view.gaps.textContent = String(client.cursor(message.stream)?.stats.gapResubscribes ?? 0);
    if (message.receivedAtMs !== null) {
      view.latency.textContent = `${Math.max(0, Date.now() - message.receivedAtMs)} ms (${message.source}, ${message.region ?? '?'})`;
    }
  }

  async function watch(stream: string): Promise<void> {
    if (stream === watching) return;
    if (watching !== null) await client.unsubscribe(watching);
    watching = stream;
    view.name.textContent = stream;
    view.name.dataset.value = stream;
    view.list.replaceChildren();
    view.error.textContent = '';
    const url = new URL(location.href);
    url.searchParams.set('stream', stream);
    history.replaceState(null, '', url.toString());
    record.startedAfter[stream] = client.position(stream)?.seq ?? null;
    try {
      await client.subscribe(stream); // its reply records the start (the 'subscribed' event)
    } catch (error) {
      view.error.textContent =
        error instanceof SubscriptionRefusedError ? (error.reply.message ?? error.error) : String(error);
    }
  }

  client.on('streamMessage', show);
  client.on('subscriptionError', (error) => {
    view.error.textContent = error.reply.message ?? error.error;
    view.error.dataset.error = error.error;
  });
  client.on('streamEpoch', (change) => {
    if (change.stream === watching) {
      view.error.textContent = `the source restarted its numbering: epoch ${change.epoch} begins`;
    }
  });
  client.on('subscribed', (reply) => {
    if (reply.stream !== watching) return;
    // A page with no saved position starts where the first reply says (the newest few), also
    // when it subscribed before the connection was open (subscribe() then answers null). Fired
    // before that reply's messages are delivered; a later resubscribe never moves the start.
    if (
      record.startedAfter[reply.stream] == null &&
      typeof reply.after === 'number' &&
      (record.seqs[reply.stream]?.length ?? 0) === 0
    ) {
      record.startedAfter[reply.stream] = reply.after;
    }
    if (reply.skipped) {
      view.error.textContent = `${reply.skipped} older messages expired before this page got them`;
    }
  });
  view.form.addEventListener('submit', (event) => {
    event.preventDefault();
    const stream = view.input.value.trim();
    if (stream !== '') void watch(stream);
  });

  fetch('/streams', { cache: 'no-store' })
    .then(async (response) => (response.ok ? ((await response.json()) as { streams?: unknown }) : {}))
    .then((body) => {
      const streams = Array.isArray(body.streams) ? body.streams.filter((s) => typeof s === 'string') : [];
      view.choices.replaceChildren(
        ...streams.map((stream) => Object.assign(document.createElement('option'), { value: stream })),
      );
      if (view.input.value === '' && streams.length > 0) view.input.placeholder = `e.g. ${streams[0]}`;
    })
    .catch(() => undefined);

  const initial = params.get('stream');
  if (initial !== null && /^[A-Za-z0-9_.:-]{1,512}$/.test(initial)) {
    view.input.value = initial;
    void watch(initial);
  }
  return record;
}
