/** The clock and timers the client uses; injectable so that tests can drive time. */
export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  /** Milliseconds; only differences are used. */
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
  now: () => Date.now(),
};
