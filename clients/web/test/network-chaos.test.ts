/**
 * The browser cursor's promise under a hostile network (the Python client's
 * test_cursor_under_network_chaos.py drives its cursor the same way): frames dropped,
 * duplicated, reordered and connections cut, replays interleaved with live frames; every
 * message still reaches the application exactly once, in order, byte for byte.
 */
import { describe, expect, it } from 'vitest';

import {
  StreamCursor,
  type MessagesFrame,
  type StreamEntry,
  type StreamMessage,
} from '../src/client/index.js';

const GAP_TIMEOUT_MS = 1000;
const QUIET_TIMEOUT_MS = 5000;
const STEP_MS = 100;
const REPLAY_BUDGET = 40;
const PART_CHARS = 9000;

/** A seeded generator (mulberry32): every failure replays from its seed. */
function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A message's entries: whole, or cut into parts the same way every time it is sent. */
function entriesOf(seq: number, data: string): StreamEntry[] {
  if (data.length <= PART_CHARS) return [{ seq, data, at: seq }];
  const parts = Math.ceil(data.length / PART_CHARS);
  return Array.from({ length: parts }, (_, part) => ({
    seq,
    part,
    parts,
    data: data.slice(part * PART_CHARS, (part + 1) * PART_CHARS),
    at: seq,
  }));
}

function run(seed: number): { log: string[]; delivered: StreamMessage[] } {
  const random = prng(seed);
  const count = 1 + Math.floor(random() * 60);
  const log = Array.from({ length: count }, (_, i) => `${i + 1}:é€😀`.repeat(Math.floor(random() * 4000)));
  const drop = random() * 0.3;
  const dup = random() * 0.3;
  const cut = random() * 0.02;
  const cursor = new StreamCursor('s', 0);
  const wire: MessagesFrame[] = [];
  const delivered: StreamMessage[] = [];
  let now = 0;
  let liveNext = 0;

  const send = (source: string, from: number, to: number): void => {
    for (let seq = from; seq <= to; seq += 1) {
      for (const entry of entriesOf(seq, log[seq - 1]!)) {
        if (random() < drop) continue; // with the connection open: a later message, or the quiet check, finds it
        const frame: MessagesFrame = { type: 'messages', stream: 's', source, messages: [entry] };
        for (let copy = random() < dup ? 2 : 1; copy > 0; copy -= 1) {
          const at = Math.max(wire.length - Math.floor(random() * Math.min(4, wire.length + 1)), 0);
          wire.splice(at, 0, frame); // reordered
        }
      }
    }
  };
  const subscribe = (): void => {
    const after = cursor.position ?? 0;
    const upTo = Math.min(log.length, after + REPLAY_BUDGET);
    const more = upTo < log.length;
    if (random() >= drop) {
      delivered.push(
        ...cursor.onSubscribed(
          { type: 'subscribed', stream: 's', after, replayed: upTo - after, upTo, more },
          now,
        ),
      );
    } else {
      cursor.retryLater(now); // the reply is lost: the client asks again after a gap timeout
    }
    send('replay', after + 1, upTo);
  };

  cursor.acknowledged = true;
  subscribe();
  for (let step = 0; step < 20000 && !(delivered.length === log.length && wire.length === 0); step += 1) {
    now += STEP_MS;
    if (liveNext < log.length && random() < 0.5) {
      const last = Math.min(log.length, liveNext + 1 + Math.floor(random() * 3));
      send('live', liveNext + 1, last);
      liveNext = last;
    }
    if (wire.length > 0 && random() < 0.8) delivered.push(...cursor.onFrame(wire.shift()!, now));
    if (random() < cut) {
      wire.length = 0; // the connection is cut: what was on the wire is gone
      cursor.countResubscribe('gap', now);
      subscribe();
      continue;
    }
    const reason = cursor.resubscribeReason(now, GAP_TIMEOUT_MS, QUIET_TIMEOUT_MS);
    if (reason !== null) {
      cursor.countResubscribe(reason, now);
      subscribe();
    }
  }
  return { log, delivered };
}

describe('StreamCursor under network chaos', () => {
  it.each(Array.from({ length: 60 }, (_, seed) => [seed]))(
    'seed %i: once, in order, byte for byte',
    (seed) => {
      const { log, delivered } = run(seed);
      expect(delivered.map((m) => [m.seq, m.data])).toEqual(log.map((data, i) => [i + 1, data]));
    },
  );
});
