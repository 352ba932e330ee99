/**
 * The providers the demo pages use against the local two-region stand-in (LocalRegions), which
 * serves the pages and, on the same origin, `GET /resolve` (the failover name's DNS answer) and
 * `GET /token?user=<name>` (a development token accepted by both regions). In production the URL
 * provider returns the custom domain and the token provider asks the identity provider.
 */
import type { AttemptContext } from '@streamfleet/web-client';

async function getJson(path: string): Promise<Record<string, unknown>> {
  const response = await fetch(path, { cache: 'no-store' });
  if (!response.ok) {
    throw new Error(`GET ${path}: HTTP ${response.status}`);
  }
  const body: unknown = await response.json();
  if (body === null || typeof body !== 'object') {
    throw new Error(`GET ${path}: expected a JSON object`);
  }
  return body as Record<string, unknown>;
}

/** The WebSocket URL the failover name resolves to right now. */
export async function resolveUrl(): Promise<string> {
  const body = await getJson('/resolve');
  if (typeof body.url !== 'string') throw new Error('GET /resolve: no "url" in the answer');
  return body.url;
}

/** Seconds since the epoch at which a JWT expires (null if it does not say). */
function expiresAt(token: string): number | null {
  try {
    const payload = token.split('.')[1];
    if (payload === undefined) return null;
    const json = atob(payload.replace(/-/g, '+').replace(/_/g, '/'));
    const exp = (JSON.parse(json) as { exp?: unknown }).exp;
    return typeof exp === 'number' ? exp : null;
  } catch {
    return null;
  }
}

/**
 * A token provider for `user`: keeps the token while it has more than a minute left, and asks
 * for a new one when the client says `forceRefresh` (the last attempt failed before opening,
 * which in a browser may mean the token was refused: the page cannot see the HTTP status).
 */
export function tokenProvider(user: string): (context: AttemptContext) => Promise<string> {
  let cached: { token: string; exp: number | null } | null = null;
  return async (context) => {
    const now = Date.now() / 1000;
    if (context.forceRefresh || cached === null || (cached.exp !== null && cached.exp - now < 60)) {
      const body = await getJson(`/token?user=${encodeURIComponent(user)}`);
      if (typeof body.token !== 'string') throw new Error('GET /token: no "token" in the answer');
      cached = { token: body.token, exp: expiresAt(body.token) };
    }
    return cached.token;
  };
}

/** A positive whole number of milliseconds from the query string, or the default. */
export function msParameter(params: URLSearchParams, name: string, fallback: number): number {
  const raw = params.get(name);
  if (raw === null || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value <= 0) {
    throw new RangeError(`?${name}=${raw}: expected a whole number of milliseconds above zero`);
  }
  return value;
}

/** User and auction names: what the server accepts as identifiers. */
export function idParameter(params: URLSearchParams, name: string, fallback: string): string {
  const value = params.get(name) ?? fallback;
  if (!/^[A-Za-z0-9_.:-]{1,64}$/.test(value)) {
    throw new RangeError(`?${name}=${value}: expected 1 to 64 of A-Z a-z 0-9 _ . : -`);
  }
  return value;
}
