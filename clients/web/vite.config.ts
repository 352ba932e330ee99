// The demo pages: the live auction (index.html) on StreamFleetClient, and the reference
// react-use-websocket configuration (react-use-websocket.html). Built into dist/, which
// LocalRegions serves next to /resolve and /token.
//
// The pages import the client by its package name, as an application does: the package refers
// to itself through its own `exports`, so they get the built library (dist/lib, made first by
// `npm run build:lib`) and nothing that is not published. This build must leave dist/lib alone.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { defineConfig, type Plugin } from 'vite';

const here = (file: string): string => fileURLToPath(new URL(file, import.meta.url));
const outDir = here('./dist');

/** emptyOutDir, except the library the pages are built from. */
function emptyAllButTheLibrary(): Plugin {
  return {
    name: 'empty-all-but-the-library',
    apply: 'build',
    buildStart() {
      if (!fs.existsSync(path.join(outDir, 'lib', 'streamfleet-client.js'))) {
        throw new Error('dist/lib is missing: run `npm run build:lib` first (npm run build does)');
      }
      for (const name of fs.readdirSync(outDir)) {
        if (name !== 'lib') fs.rmSync(path.join(outDir, name), { recursive: true, force: true });
      }
    },
  };
}

export default defineConfig({
  // Relative asset URLs: the pages work wherever the static directory is mounted.
  base: './',
  plugins: [emptyAllButTheLibrary()],
  build: {
    outDir,
    emptyOutDir: false,
    target: 'es2022',
    rolldownOptions: {
      input: {
        auction: here('./index.html'),
        rws: here('./react-use-websocket.html'),
      },
    },
  },
});
