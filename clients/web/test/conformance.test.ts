/// <reference types="node" />
/**
 * The browser cursor against the hostile frames both clients must read alike
 * (tests/conformance/stream_entries.json; the Python client runs the same cases).
 */
import { readFileSync } from 'node:fs';

import { describe, expect, it } from 'vitest';

import { StreamCursor, type MessagesFrame } from '../src/client/index.js';

interface Case {
  name: string;
  frame: string;
  delivered: [number, number, string][];
}

const { cases } = JSON.parse(
  readFileSync(new URL('../../../tests/conformance/stream_entries.json', import.meta.url), 'utf8'),
) as { cases: Case[] };

describe('hostile frames, read as the Python client reads them', () => {
  it.each(cases.map((c) => [c.name, c] as const))('%s', (_name, c) => {
    const cursor = new StreamCursor('s', 0);
    cursor.acknowledged = true;
    const delivered = cursor.onFrame(JSON.parse(c.frame) as MessagesFrame, 0);
    expect(delivered.map((m) => [m.epoch, m.seq, m.data])).toEqual(c.delivered);
  });
});
