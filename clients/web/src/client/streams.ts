/**
 * One subscribed stream on the client side: exactly once, in seq order, no gap. The browser
 * counterpart of the Python `StreamCursor` (runtime/streamfleet/client/streams.py).
 *
 * The wire gives at least once, in any order: the subscribe handler's replay and the fan-out's
 * live frames are separate posts that may interleave, a worker crash or a regional failover
 * makes the fleet rewrite seqs it had stored, and after a reconnect the replay repeats what
 * arrived live before. A cursor turns that into what the application sees:
 *
 * - `position` is the last seq delivered; anything at or below it is a duplicate and dropped;
 * - anything above `position + 1` waits in a bounded buffer until the seqs before it arrive (a
 *   message too big for one frame arrives in parts, joined first);
 * - a gap that stays open longer than the gap timeout asks for a fresh subscribe from
 *   `position` (the stored log fills it), each unproductive retry waiting twice as long; so does
 *   a replay cut at its budget (`more`), once caught up with it;
 * - when the buffer is full the highest seqs are dropped: the next replay brings them back.
 */

import type { MessagesFrame, StreamEntry, StreamMessage, SubscribedReply } from './protocol.js';

export const DEFAULT_MAX_BUFFERED = 10_000;
export const DEFAULT_GAP_TIMEOUT_MS = 2000;
const MAX_GAP_DOUBLINGS = 6;

/** Why a cursor wants a subscribe sent now. */
export type ResubscribeReason = 'gap' | 'more' | 'start';

/** What a cursor did: a test's and a dashboard's evidence. */
export interface CursorStats {
  delivered: number;
  duplicates: number;
  bufferedMax: number;
  droppedForSpace: number;
  gapResubscribes: number;
  moreResubscribes: number;
}

/** Parts of one message at most (a 384 KiB message takes about 13 frames of 32 KB). */
export const MAX_PARTS = 64;
/** Characters of incomplete parts held per stream at most; the highest seqs are evicted first. */
export const MAX_PART_CHARS = 4 * 1024 * 1024;

export class StreamCursor {
  readonly stream: string;
  position: number | null;
  readonly maxBuffered: number;
  readonly stats: CursorStats = {
    delivered: 0,
    duplicates: 0,
    bufferedMax: 0,
    droppedForSpace: 0,
    gapResubscribes: 0,
    moreResubscribes: 0,
  };
  /** A subscribe request is on its way (one at a time). */
  inFlight = false;
  /** A subscribe of the current connection was answered. */
  acknowledged = false;
  private readonly buffer = new Map<number, StreamMessage>();
  /** seq -> the number of parts its cut has, and the parts received so far by index. */
  private readonly parts = new Map<number, { total: number; pieces: Map<number, string> }>();
  /** Characters held in incomplete parts (bounded: the highest seqs are evicted first). */
  partChars = 0;
  /** The id of this cursor's own subscribe in flight: only its reply moves the cursor. */
  requestId: string | null = null;
  private gapSince: number | null = null;
  private gapAttempts = 0;
  private moreUpTo: number | null = null;
  /** The last seq a subscribe reply promised: awaited like a gap, so a replay whose frames were
   * lost is asked for again even on a quiet or stopped stream. */
  private promisedUpTo: number | null = null;

  constructor(stream: string, position: number | null = null, maxBuffered = DEFAULT_MAX_BUFFERED) {
    this.stream = stream;
    this.position = position;
    this.maxBuffered = maxBuffered;
  }

  get buffered(): number {
    return this.buffer.size;
  }

  /** A `subscribed` reply: where the log starts for us, and whether the replay was cut. */
  onSubscribed(reply: SubscribedReply, now: number): StreamMessage[] {
    this.acknowledged = true;
    // Parts of a message the replay that follows brings whole are dropped: no part from before
    // a reconnect joins one from after it. Parts past the replay are kept: a live message
    // stored after the replay's read may have posted its first parts already.
    const replayEnd = typeof reply.upTo === 'number' ? reply.upTo : null;
    for (const seq of [...this.parts.keys()]) {
      if (replayEnd === null || seq <= replayEnd) this.dropParts(seq);
    }
    const after = reply.after;
    if (typeof after === 'number' && Number.isSafeInteger(after)) {
      // No position yet: a first subscribe from the newest. Above ours: nothing exists in
      // between (before the stream's origin, or expired): nothing to wait for.
      if (this.position === null || after > this.position) this.position = after;
    }
    const promised = typeof reply.upTo === 'number' && Number.isSafeInteger(reply.upTo);
    this.moreUpTo = reply.more === true && promised ? reply.upTo : null;
    this.promisedUpTo = promised ? reply.upTo : null;
    return this.drain(now);
  }

  /** The entries of a `messages` frame; the messages now deliverable, in order. */
  onFrame(frame: MessagesFrame, now: number): StreamMessage[] {
    const entries = Array.isArray(frame.messages) ? frame.messages : [];
    for (const entry of entries) {
      const message = this.message(entry, frame);
      if (message === null) continue;
      if ((this.position !== null && message.seq <= this.position) || this.buffer.has(message.seq)) {
        this.stats.duplicates += 1;
        continue;
      }
      this.buffer.set(message.seq, message);
      if (this.buffer.size > this.maxBuffered) {
        // The highest seqs are the cheapest to lose: the next replay brings them back.
        this.buffer.delete(Math.max(...this.buffer.keys()));
        this.stats.droppedForSpace += 1;
      }
    }
    this.stats.bufferedMax = Math.max(this.stats.bufferedMax, this.buffer.size);
    return this.drain(now);
  }

  /** Whether a subscribe from `position` should be sent now (never while one is in flight). */
  resubscribeReason(now: number, gapTimeoutMs: number): ResubscribeReason | null {
    if (this.inFlight || !this.acknowledged) return null;
    if (this.position === null) {
      if (this.buffer.size > 0 || this.parts.size > 0) return 'start';
      // A first subscribe that failed (no answer, or an error) is sent again after the timeout,
      // each time more patiently.
      const wait = gapTimeoutMs * 2 ** Math.min(this.gapAttempts, MAX_GAP_DOUBLINGS);
      return this.gapSince !== null && now - this.gapSince >= wait ? 'start' : null;
    }
    if (this.moreUpTo !== null && this.position >= this.moreUpTo) return 'more';
    // A gap the log cannot fill (a stopped stream's unsealed tail) must not cost a subscribe
    // every timeout for ever: each unproductive retry waits twice as long.
    const wait = gapTimeoutMs * 2 ** Math.min(this.gapAttempts, MAX_GAP_DOUBLINGS);
    if (this.gapSince !== null && now - this.gapSince >= wait) return 'gap';
    return null;
  }

  /** A subscribe is being sent for `reason`: restart the gap's clock. */
  countResubscribe(reason: ResubscribeReason, now: number): void {
    if (reason === 'gap') {
      this.stats.gapResubscribes += 1;
      this.gapAttempts += 1;
    } else if (reason === 'start') {
      this.gapAttempts += 1; // until something is delivered
    } else if (reason === 'more') {
      this.stats.moreResubscribes += 1;
    }
    this.moreUpTo = null;
    this.promisedUpTo = null; // the next reply promises anew
    this.gapSince = this.buffer.size > 0 || this.parts.size > 0 ? now : null;
  }

  /** A subscribe failed to get an answer: try again after a gap timeout. */
  retryLater(now: number): void {
    this.acknowledged = true;
    this.gapSince = now;
  }

  private message(entry: StreamEntry, frame: MessagesFrame): StreamMessage | null {
    if (entry === null || typeof entry !== 'object') return null;
    const { seq, data } = entry;
    if (!Number.isSafeInteger(seq) || typeof data !== 'string') return null;
    const receivedAtMs = Number.isSafeInteger(entry.at) ? (entry.at as number) : null;
    const base = {
      stream: this.stream,
      seq,
      receivedAtMs,
      source: frame.source ?? '',
      region: typeof frame.region === 'string' ? frame.region : null,
      json: entry.format === 'json',
    };
    if (entry.parts === undefined) return { ...base, data };
    const { part, parts } = entry;
    if (!Number.isInteger(part) || !Number.isInteger(parts) || part! < 0 || part! >= parts!) return null;
    if (parts! > MAX_PARTS) return null;
    if (this.position !== null && seq <= this.position) return { ...base, data: '' }; // a duplicate
    let held = this.parts.get(seq);
    if (held !== undefined && held.total !== parts) {
      this.dropParts(seq); // another cut of the same message: never joined with this one
      held = undefined;
    }
    if (held === undefined) {
      held = { total: parts!, pieces: new Map() };
      this.parts.set(seq, held);
    }
    this.partChars += data.length - (held.pieces.get(part!)?.length ?? 0);
    held.pieces.set(part!, data);
    if (held.pieces.size < held.total) {
      this.boundParts();
      return null;
    }
    let joined = '';
    for (let index = 0; index < held.total; index += 1) joined += held.pieces.get(index)!;
    this.dropParts(seq);
    return { ...base, data: joined };
  }

  private dropParts(seq: number): void {
    const held = this.parts.get(seq);
    if (held === undefined) return;
    for (const piece of held.pieces.values()) this.partChars -= piece.length;
    this.parts.delete(seq);
  }

  private boundParts(): void {
    while (this.partChars > MAX_PART_CHARS && this.parts.size > 0) {
      this.dropParts(Math.max(...this.parts.keys()));
      this.stats.droppedForSpace += 1;
    }
  }

  private drain(now: number): StreamMessage[] {
    const ready: StreamMessage[] = [];
    if (this.position !== null) {
      for (;;) {
        const next = this.buffer.get(this.position + 1);
        if (next === undefined) break;
        this.buffer.delete(next.seq);
        this.position = next.seq;
        ready.push(next);
      }
      for (const seq of [...this.buffer.keys()]) {
        if (seq <= this.position) {
          this.buffer.delete(seq);
          this.stats.duplicates += 1;
        }
      }
      for (const seq of [...this.parts.keys()]) if (seq <= this.position) this.dropParts(seq);
    }
    this.stats.delivered += ready.length;
    if (ready.length > 0) this.gapAttempts = 0;
    if (this.promisedUpTo !== null && this.position !== null && this.position >= this.promisedUpTo) {
      this.promisedUpTo = null;
    }
    const waiting = this.buffer.size > 0 || this.parts.size > 0 || this.promisedUpTo !== null;
    if (!waiting) this.gapSince = null;
    else if (this.gapSince === null || ready.length > 0) this.gapSince = now;
    return ready;
  }
}
