/** The clock and timers the client uses; injectable so that tests can drive time. */
export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  /** Milliseconds on any monotonic clock; only differences are used. */
  now(): number;
}

/**
 * The global timers, looked up at call time (so test frameworks that replace the globals, such
 * as vitest's fake timers, are honoured).
 */
export const globalTimers: Timers = {
  setTimeout: (callback, ms) => globalThis.setTimeout(callback, ms),
  clearTimeout: (handle) => {
    globalThis.clearTimeout(handle as ReturnType<typeof globalThis.setTimeout>);
  },
  // Monotonic where there is one: a wall-clock jump must not fake a missed pong.
  now: () => (typeof performance !== 'undefined' ? performance.now() : Date.now()),
};
