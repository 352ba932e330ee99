/** Errors the client raises. Every one is a {@link StreamFleetError}. */

export class StreamFleetError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** There is no open connection right now (the client is connecting or backing off). */
export class NotConnectedError extends StreamFleetError {}

/** Not connected, and `sendQueueSize` messages already wait: nothing was queued. */
export class SendQueueFullError extends NotConnectedError {
  constructor(readonly size: number) {
    super(`not connected, and the send queue is full (${size})`);
  }
}

/** The connection ended while a request waited for its reply (it may have been applied). */
export class ConnectionLostError extends StreamFleetError {}

/** The client was closed. */
export class ClientClosedError extends StreamFleetError {}

/** No reply echoed the request's `requestId` in time. */
export class RequestTimeoutError extends StreamFleetError {
  constructor(
    readonly requestId: string,
    readonly timeoutMs: number,
  ) {
    super(`no reply to request ${requestId} within ${timeoutMs} ms`);
  }
}

/**
 * Refused locally: API Gateway allows 32 KB per frame and closes the socket (1009) on a bigger
 * one, losing every reply in flight.
 */
export class FrameTooLargeError extends StreamFleetError {
  constructor(
    readonly bytes: number,
    readonly limit: number,
  ) {
    super(`frame of ${bytes} bytes refused: the API allows at most ${limit} bytes per frame`);
  }
}

/** The server answered with `{"type": "error", ...}`. */
export class ServerError extends StreamFleetError {
  constructor(readonly reply: { error: string; message?: string; field?: string; retryable?: boolean }) {
    super(reply.message ?? reply.error);
  }

  get field(): string | undefined {
    return this.reply.field;
  }

  get retryable(): boolean {
    return this.reply.retryable === true;
  }
}

/** The server refused a subscribe (`forbidden`, `not_supported`, `bad_request`); the stream is
 * no longer subscribed. */
export class SubscriptionRefusedError extends StreamFleetError {
  constructor(
    readonly stream: string,
    readonly reply: { error: string; message?: string; field?: string },
  ) {
    super(`subscribe ${stream}: ${reply.error}: ${reply.message ?? ''}`);
  }

  get error(): string {
    return this.reply.error;
  }
}
