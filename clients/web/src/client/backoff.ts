/** Exponential backoff with full jitter: 2 s base, 20 s cap. */

export const DEFAULT_BACKOFF_BASE_MS = 2000;
export const DEFAULT_BACKOFF_CAP_MS = 20000;

/**
 * The delay before reconnect attempt number `attempt` (0 for the first retry):
 * `random() * min(baseMs * 2**attempt, capMs)`, so that the clients a failover drops spread
 * their reconnects over the window instead of all hitting the surviving region at once.
 */
export function fullJitterBackoff(
  attempt: number,
  random: () => number = Math.random,
  baseMs: number = DEFAULT_BACKOFF_BASE_MS,
  capMs: number = DEFAULT_BACKOFF_CAP_MS,
): number {
  if (!Number.isInteger(attempt) || attempt < 0) {
    throw new RangeError(`attempt: expected a whole number >= 0, got ${String(attempt)}`);
  }
  // 2**attempt overflows to Infinity for large attempts; min() keeps the cap.
  return random() * Math.min(baseMs * 2 ** attempt, capMs);
}
