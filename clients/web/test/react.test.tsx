// The React binding through React itself (react-dom/client and act, in Chromium: the browser
// vitest config runs this file, `make test-e2e`), the server played by a fake socket.
// feeds.test.ts checks the store beneath it under Node in the gate.
import { act, StrictMode } from 'react';
import { createRoot, type Root } from 'react-dom/client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { type StreamFleetClient, storagePositions } from '../src/client/index.js';
import { useStream } from '../src/client/react.js';
import { connected, deliver, sent, serve } from './connected-client.js';

(globalThis as { IS_REACT_ACT_ENVIRONMENT?: boolean }).IS_REACT_ACT_ENVIRONMENT = true;

function Feed({ client, stream, keep }: { client: StreamFleetClient; stream: string; keep?: number }) {
  const { messages, status, ready } = useStream(client, stream, keep === undefined ? {} : { keep });
  return (
    <ol data-stream={stream} data-status={status} data-ready={String(ready)}>
      {messages.map((m) => (
        <li key={`${m.epoch}:${m.seq}`}>{m.data}</li>
      ))}
    </ol>
  );
}

let container: HTMLDivElement;
let root: Root;

beforeEach(() => {
  container = document.createElement('div');
  document.body.append(container);
  root = createRoot(container);
});

afterEach(async () => {
  await act(async () => root.unmount());
  container.remove();
});

const shown = (stream = 's'): string[] =>
  [...container.querySelectorAll(`ol[data-stream="${stream}"] li`)].map((li) => li.textContent ?? '');

async function render(node: React.ReactNode): Promise<void> {
  await act(async () => root.render(node));
}

describe('useStream', () => {
  it("subscribes once under StrictMode's double mount, and shows the messages and the state", async () => {
    const { client, socket } = await connected();
    await render(
      <StrictMode>
        <Feed client={client} stream="s" />
      </StrictMode>,
    );
    expect(sent(socket, 'subscribe', 's')).toHaveLength(1);
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(0);
    await act(async () => serve(socket, 's', 0, [1, 2, 3]));
    expect(shown()).toEqual(['d1', 'd2', 'd3']);
    const list = container.querySelector('ol')!;
    expect([list.dataset.status, list.dataset.ready]).toEqual(['open', 'true']);
    await act(async () => client.close());
  });

  it('unsubscribes when the last component showing the stream unmounts, and leaves the client open', async () => {
    const { client, socket } = await connected();
    await render(
      <>
        <Feed client={client} stream="s" />
        <Feed client={client} stream="s" keep={1} />
      </>,
    );
    await act(async () => serve(socket, 's', 0, [1, 2]));
    expect(container.querySelectorAll('li')).toHaveLength(3); // keep 1 shows the last only
    await render(<Feed client={client} stream="s" />);
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(0);
    await render(null);
    expect(sent(socket, 'subscribe', 's')).toHaveLength(1);
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(1);
    expect(client.status).toBe('open');
    await act(async () => client.close());
  });

  it('shows what it had after a remount, then what it missed, with no duplicate', async () => {
    const { client, socket } = await connected();
    await render(<Feed client={client} stream="s" />);
    await act(async () => serve(socket, 's', 0, [1, 2, 3]));
    await render(null);
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(1);
    await render(<Feed client={client} stream="s" />);
    expect(shown()).toEqual(['d1', 'd2', 'd3']);
    expect(sent(socket, 'subscribe', 's').at(-1)).toMatchObject({ after: 3 });
    // The replay repeats what the page had (the wire is at least once).
    await act(async () => serve(socket, 's', 2, [2, 3, 4, 5]));
    expect(shown()).toEqual(['d1', 'd2', 'd3', 'd4', 'd5']);
    await act(async () => client.close());
  });

  it('resumes after a reload from the position kept in localStorage', async () => {
    const prefix = `test.${Math.random().toString(36).slice(2)}.`;
    try {
      const page = await connected(storagePositions(localStorage, prefix));
      await render(<Feed client={page.client} stream="s" />);
      await act(async () => serve(page.socket, 's', 0, [1, 2, 3]));
      await act(async () => page.client.close()); // the page goes away; a new one starts with a new client
      await render(null);
      const reloaded = await connected(storagePositions(localStorage, prefix));
      await render(<Feed client={reloaded.client} stream="s" />);
      expect(sent(reloaded.socket, 'subscribe', 's')).toMatchObject([{ after: 3 }]);
      await act(async () => serve(reloaded.socket, 's', 3, [3, 4]));
      await act(async () => deliver(reloaded.socket, 's', [5]));
      expect(shown()).toEqual(['d4', 'd5']);
      await act(async () => reloaded.client.close());
    } finally {
      for (const key of Object.keys(localStorage)) if (key.startsWith(prefix)) localStorage.removeItem(key);
    }
  });
});
