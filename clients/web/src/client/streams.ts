/**
 * One subscribed stream on the client side: exactly once, in seq order, no gap. The browser
 * counterpart of the Python `StreamCursor` (runtime/streamfleet/client/streams.py).
 *
 * The wire gives at least once, in any order: the subscribe handler's replay and the fan-out's
 * live frames are separate posts that may interleave, a worker crash or a regional failover
 * makes the fleet rewrite seqs it had stored, and after a reconnect the replay repeats what
 * arrived live before. A cursor turns that into what the application sees:
 *
 * - `position` is the last seq delivered, counted in `epoch`; anything at or below it, or of an
 *   older epoch, is a duplicate and dropped;
 * - a stream whose upstream restarted its numbering goes on in a newer epoch: the subscribe reply
 *   moves the cursor there once nothing more can come in the old one, and the application hears
 *   of it (`takeEpochChange`) before the new epoch's first message. An entry of a newer epoch
 *   that arrives before that counts as a gap: the log fills in the rest of the old epoch first;
 * - anything above `position + 1` waits in a bounded buffer until the seqs before it arrive (a
 *   message too big for one frame arrives in parts, joined first);
 * - a gap that stays open longer than the gap timeout asks for a fresh subscribe from
 *   `position` (the stored log fills it), each unproductive retry waiting twice as long; so does
 *   a replay cut at its budget (`more`), once caught up with it;
 * - when the buffer is full the highest seqs are dropped: the next replay brings them back.
 */

import {
  comparePositions,
  type EpochChange,
  type MessagesFrame,
  type Skip,
  type StreamEntry,
  type StreamMessage,
  type StreamPosition,
  type SubscribedReply,
} from './protocol.js';

export const DEFAULT_MAX_BUFFERED = 10_000;
export const DEFAULT_GAP_TIMEOUT_MS = 2000;
/** How long a subscribed stream may stay quiet before it asks where its log ends. */
export const DEFAULT_QUIET_TIMEOUT_MS = 60_000;
const MAX_GAP_DOUBLINGS = 6;

/** Why a cursor wants a subscribe sent now. */
export type ResubscribeReason = 'gap' | 'more' | 'start' | 'quiet';

/** What a cursor did: a test's and a dashboard's evidence. */
export interface CursorStats {
  delivered: number;
  duplicates: number;
  bufferedMax: number;
  droppedForSpace: number;
  gapResubscribes: number;
  moreResubscribes: number;
  /** A quiet stream asked where its log ends (a lost last post). */
  quietResubscribes: number;
}

/** A quiet stream asks again after its timeout, then twice as long, up to 2**4 times as long. */
export const QUIET_BACKOFF_STEPS = 4;

/** Parts of one message at most (a 384 KiB message takes about 13 frames of 32 KB). */
export const MAX_PARTS = 64;
/** Characters of incomplete parts held per stream at most; the highest seqs are evicted first. */
export const MAX_PART_CHARS = 4 * 1024 * 1024;

export class StreamCursor {
  readonly stream: string;
  position: number | null;
  /** The epoch `position` counts in. */
  epoch: number;
  /** An entry of a newer epoch arrived: waited for like a gap. */
  ahead = false;
  readonly maxBuffered: number;
  readonly stats: CursorStats = {
    delivered: 0,
    duplicates: 0,
    bufferedMax: 0,
    droppedForSpace: 0,
    gapResubscribes: 0,
    moreResubscribes: 0,
    quietResubscribes: 0,
  };
  /** A subscribe request is on its way (one at a time). */
  inFlight = false;
  /** A subscribe of the current connection was answered. */
  acknowledged = false;
  readonly #buffer = new Map<number, StreamMessage>();
  /** seq -> the number of parts its cut has, and the parts received so far by index. */
  readonly #parts = new Map<number, { total: number; pieces: Map<number, string> }>();
  /** Characters held in incomplete parts (bounded: the highest seqs are evicted first). */
  partChars = 0;
  /** The id of this cursor's own subscribe in flight: only its reply moves the cursor. */
  requestId: string | null = null;
  #gapSince: number | null = null;
  #gapAttempts = 0;
  /** The last frame or reply of this stream. */
  #heardAt: number | null = null;
  /** Quiet resubscribes that found nothing since the last that found a lost tail: each waits
   * twice as long (a delivery does not reset it: a slow stream would pay a subscribe a gap). */
  #quietAttempts = 0;
  /** The subscribe in flight is a quiet one. */
  #quietAsked = false;
  #moreUpTo: StreamPosition | null = null;
  /** The last position a subscribe reply promised: awaited like a gap, so a replay whose frames
   * were lost is asked for again even on a quiet or stopped stream. */
  #promisedUpTo: StreamPosition | null = null;
  #epochChange: EpochChange | null = null;
  #skip: Skip | null = null;

  constructor(
    stream: string,
    position: StreamPosition | number | null = null,
    maxBuffered = DEFAULT_MAX_BUFFERED,
  ) {
    this.stream = stream;
    if (typeof position === 'number') position = { epoch: 0, seq: position };
    this.position = position?.seq ?? null;
    this.epoch = position?.epoch ?? 0;
    this.maxBuffered = maxBuffered;
  }

  /** `position` with its epoch; null before the first. */
  get at(): StreamPosition | null {
    return this.position === null ? null : { epoch: this.epoch, seq: this.position };
  }

  /** Go on from `position` (the application's own, ahead of the cursor's): what the cursor
   * held of another epoch is dropped with it. */
  moveTo(position: StreamPosition): void {
    if (position.epoch !== this.epoch) {
      this.#buffer.clear();
      for (const seq of [...this.#parts.keys()]) this.#dropParts(seq);
      this.epoch = position.epoch;
      this.ahead = false;
    }
    this.position = position.seq;
  }

  /** The forward jump the last reply made within the epoch, once (null: none). */
  takeSkip(): Skip | null {
    const skip = this.#skip;
    this.#skip = null;
    return skip;
  }

  /** The epoch change the last reply made, once (null: none): tell the application before
   * delivering what follows it. */
  takeEpochChange(): EpochChange | null {
    const change = this.#epochChange;
    this.#epochChange = null;
    return change;
  }

  get buffered(): number {
    return this.#buffer.size;
  }

  /** A `subscribed` reply: where the log starts for us, and whether the replay was cut. */
  onSubscribed(reply: SubscribedReply, now: number): StreamMessage[] {
    this.acknowledged = true;
    this.#heardAt = now;
    if (this.#quietAsked) {
      this.#quietAsked = false;
      const found = replyPosition(reply.upTo, reply.upToEpoch);
      const at = this.at;
      // It found a lost tail: ask as soon again.
      if (found !== null && at !== null && comparePositions(found, at) > 0) this.#quietAttempts = 0;
    }
    // Parts of a message the replay that follows brings whole are dropped: no part from before
    // a reconnect joins one from after it. Parts past the replay are kept: a live message
    // stored after the replay's read may have posted its first parts already.
    const upTo = replyPosition(reply.upTo, reply.upToEpoch);
    for (const seq of [...this.#parts.keys()]) {
      if (upTo === null || comparePositions({ epoch: this.epoch, seq }, upTo) <= 0) this.#dropParts(seq);
    }
    const after = replyPosition(reply.after, reply.afterEpoch);
    const at = this.at;
    if (after !== null && (at === null || comparePositions(after, at) > 0)) {
      // No position yet: a first subscribe from the newest. Above ours: nothing exists in
      // between (before the stream's origin, expired, or the rest of an epoch that ended).
      if (after.epoch !== this.epoch && at !== null) {
        this.#epochChange = { stream: this.stream, epoch: after.epoch, previous: this.epoch };
        // The new epoch's first seqs are not in the log either (expired, or before the
        // stream's origin): told as a jump within it.
        if (after.seq > 0) this.#skip = { stream: this.stream, epoch: after.epoch, after: 0, to: after.seq };
      } else if (at !== null) {
        this.#skip = { stream: this.stream, epoch: this.epoch, after: at.seq, to: after.seq };
      }
      this.moveTo(after);
    }
    this.#moreUpTo = reply.more === true ? upTo : null;
    this.#promisedUpTo = upTo;
    return this.#drain(now);
  }

  /** The entries of a `messages` frame; the messages now deliverable, in order. */
  onFrame(frame: MessagesFrame, now: number): StreamMessage[] {
    this.#heardAt = now;
    const entries = Array.isArray(frame.messages) ? frame.messages : [];
    for (const entry of entries) {
      const message = this.#message(entry, frame);
      if (message === null) continue;
      if (message.epoch !== this.epoch) {
        if (message.epoch > this.epoch)
          this.ahead = true; // the log holds what comes before it
        else this.stats.duplicates += 1;
        continue;
      }
      if ((this.position !== null && message.seq <= this.position) || this.#buffer.has(message.seq)) {
        this.stats.duplicates += 1;
        continue;
      }
      this.#buffer.set(message.seq, message);
      if (this.#buffer.size > this.maxBuffered) {
        // The highest seqs are the cheapest to lose: the next replay brings them back.
        this.#buffer.delete(Math.max(...this.#buffer.keys()));
        this.stats.droppedForSpace += 1;
      }
    }
    this.stats.bufferedMax = Math.max(this.stats.bufferedMax, this.#buffer.size);
    return this.#drain(now);
  }

  /**
   * Whether a subscribe from `position` should be sent now (never while one is in flight).
   * `quiet`: nothing of the stream was heard for `quietTimeoutMs` (doubling while each finds
   * nothing new). A live post can be lost with its connection still open (a fan-out out of
   * time, a batch given up): a later message shows the gap, but after a stream's last message
   * nothing would, so a quiet stream asks where its log ends.
   */
  resubscribeReason(
    now: number,
    gapTimeoutMs: number,
    quietTimeoutMs: number | null = null,
  ): ResubscribeReason | null {
    if (this.inFlight || !this.acknowledged) return null;
    if (this.position === null) {
      if (this.#buffer.size > 0 || this.#parts.size > 0) return 'start';
      // A first subscribe that failed (no answer, or an error) is sent again after the timeout,
      // each time more patiently.
      const wait = gapTimeoutMs * 2 ** Math.min(this.#gapAttempts, MAX_GAP_DOUBLINGS);
      return this.#gapSince !== null && now - this.#gapSince >= wait ? 'start' : null;
    }
    if (
      this.#moreUpTo !== null &&
      comparePositions({ epoch: this.epoch, seq: this.position }, this.#moreUpTo) >= 0
    ) {
      return 'more';
    }
    // A gap the log cannot fill (a stopped stream's unsealed tail) must not cost a subscribe
    // every timeout for ever: each unproductive retry waits twice as long.
    const wait = gapTimeoutMs * 2 ** Math.min(this.#gapAttempts, MAX_GAP_DOUBLINGS);
    if (this.#gapSince !== null && now - this.#gapSince >= wait) return 'gap';
    if (quietTimeoutMs !== null && this.#heardAt !== null && this.#gapSince === null) {
      const quiet = quietTimeoutMs * 2 ** Math.min(this.#quietAttempts, QUIET_BACKOFF_STEPS);
      if (now - this.#heardAt >= quiet) return 'quiet';
    }
    return null;
  }

  /** A subscribe is being sent for `reason`: restart the gap's clock. */
  countResubscribe(reason: ResubscribeReason, now: number): void {
    if (reason === 'gap') {
      this.stats.gapResubscribes += 1;
      this.#gapAttempts += 1;
    } else if (reason === 'start') {
      this.#gapAttempts += 1; // until something is delivered
    } else if (reason === 'more') {
      this.stats.moreResubscribes += 1;
    } else if (reason === 'quiet') {
      this.stats.quietResubscribes += 1;
      this.#quietAttempts += 1;
      this.#quietAsked = true;
      this.#heardAt = now;
    }
    this.#moreUpTo = null;
    this.#promisedUpTo = null; // the next reply promises anew
    this.#gapSince = this.#buffer.size > 0 || this.#parts.size > 0 || this.ahead ? now : null;
  }

  /** A subscribe failed to get an answer: try again after a gap timeout. */
  retryLater(now: number): void {
    this.acknowledged = true;
    this.#gapSince = now;
  }

  #message(entry: StreamEntry, frame: MessagesFrame): StreamMessage | null {
    if (entry === null || typeof entry !== 'object') return null;
    const { seq, data } = entry;
    const epoch = entry.epoch ?? 0;
    if (!wireWhole(seq) || !wireWhole(epoch) || typeof data !== 'string') return null;
    const receivedAtMs = wireWhole(entry.at) ? (entry.at as number) : null;
    const base = {
      stream: this.stream,
      seq,
      epoch,
      receivedAtMs,
      source: frame.source ?? '',
      region: typeof frame.region === 'string' ? frame.region : null,
      json: entry.format === 'json',
    };
    if (entry.parts === undefined) return { ...base, data };
    const { part, parts } = entry;
    if (!wireWhole(part) || !wireWhole(parts) || part! >= parts!) return null;
    if (parts! > MAX_PARTS) return null;
    if (epoch !== this.epoch || (this.position !== null && seq <= this.position)) {
      return { ...base, data: '' }; // a duplicate, or of a newer epoch: judged by the caller
    }
    let held = this.#parts.get(seq);
    if (held !== undefined && held.total !== parts) {
      this.#dropParts(seq); // another cut of the same message: never joined with this one
      held = undefined;
    }
    if (held === undefined) {
      held = { total: parts!, pieces: new Map() };
      this.#parts.set(seq, held);
    }
    this.partChars += data.length - (held.pieces.get(part!)?.length ?? 0);
    held.pieces.set(part!, data);
    if (held.pieces.size < held.total) {
      this.#boundParts();
      return null;
    }
    let joined = '';
    for (let index = 0; index < held.total; index += 1) joined += held.pieces.get(index)!;
    this.#dropParts(seq);
    return { ...base, data: joined };
  }

  #dropParts(seq: number): void {
    const held = this.#parts.get(seq);
    if (held === undefined) return;
    for (const piece of held.pieces.values()) this.partChars -= piece.length;
    this.#parts.delete(seq);
  }

  #boundParts(): void {
    while (this.partChars > MAX_PART_CHARS && this.#parts.size > 0) {
      this.#dropParts(Math.max(...this.#parts.keys()));
      this.stats.droppedForSpace += 1;
    }
  }

  #drain(now: number): StreamMessage[] {
    const ready: StreamMessage[] = [];
    if (this.position !== null) {
      for (;;) {
        const next = this.#buffer.get(this.position + 1);
        if (next === undefined) break;
        this.#buffer.delete(next.seq);
        this.position = next.seq;
        ready.push(next);
      }
      for (const seq of [...this.#buffer.keys()]) {
        if (seq <= this.position) {
          this.#buffer.delete(seq);
          this.stats.duplicates += 1;
        }
      }
      for (const seq of [...this.#parts.keys()]) if (seq <= this.position) this.#dropParts(seq);
    }
    this.stats.delivered += ready.length;
    if (ready.length > 0) this.#gapAttempts = 0;
    const at = this.at;
    if (this.#promisedUpTo !== null && at !== null && comparePositions(at, this.#promisedUpTo) >= 0) {
      this.#promisedUpTo = null;
    }
    const waiting =
      this.#buffer.size > 0 || this.#parts.size > 0 || this.#promisedUpTo !== null || this.ahead;
    if (!waiting) this.#gapSince = null;
    else if (this.#gapSince === null || ready.length > 0) this.#gapSince = now;
    return ready;
  }
}

/** A wire whole number, as both clients read it: 0 to 2**53 - 1 (`1.0` is 1 once parsed). */
function wireWhole(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** A reply's `seq` in `epoch` (0 when absent); null without a seq. */
function replyPosition(seq: unknown, epoch: unknown): StreamPosition | null {
  const inEpoch = epoch ?? 0;
  if (!wireWhole(seq) || !wireWhole(inEpoch)) return null;
  return { epoch: inEpoch, seq };
}
