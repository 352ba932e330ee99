// The demo pages: the live auction (index.html) on StreamFleetClient, and the reference
// react-use-websocket configuration (react-use-websocket.html). Built into dist/, which
// LocalRegions serves next to /resolve and /token.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));

export default defineConfig({
  // Relative asset URLs: the pages work wherever the static directory is mounted.
  base: './',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    rolldownOptions: {
      input: {
        auction: here('./index.html'),
        rws: here('./react-use-websocket.html'),
      },
    },
  },
});
