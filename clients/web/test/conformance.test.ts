/**
 * The browser cursor against the hostile frames both clients must read alike
 * (tests/conformance/stream_entries.json; the Python client runs the same cases).
 */
import { describe, expect, it } from 'vitest';

import { StreamCursor, type MessagesFrame } from '../src/client/index.js';
// Imported, not read from disk: the same test runs in Chromium, which has no file system.
import conformance from '../../../tests/conformance/stream_entries.json';

interface Case {
  name: string;
  frame: string;
  delivered: [number, number, string][];
}

const { cases } = conformance as unknown as { cases: Case[] };

describe('hostile frames, read as the Python client reads them', () => {
  it.each(cases.map((c) => [c.name, c] as const))('%s', (_name, c) => {
    const cursor = new StreamCursor('s', 0);
    cursor.acknowledged = true;
    const delivered = cursor.onFrame(JSON.parse(c.frame) as MessagesFrame, 0);
    expect(delivered.map((m) => [m.epoch, m.seq, m.data])).toEqual(c.delivered);
  });
});
