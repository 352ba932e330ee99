// The library build: the client as an ES module (dist/lib/streamfleet-client.js) and as
// CommonJS (dist/lib/streamfleet-client.cjs), each with no dependencies and unminified (the
// application's bundler minifies). Declarations come from tsc -p tsconfig.lib.json into
// dist/lib/types, and scripts/package-lib.mjs copies them as .d.cts for require().
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

export default defineConfig({
  build: {
    outDir: 'dist/lib',
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: true,
    minify: false,
    lib: {
      entry: fileURLToPath(new URL('./src/client/index.ts', import.meta.url)),
      formats: ['es', 'cjs'],
      fileName: (format) => (format === 'es' ? 'streamfleet-client.js' : 'streamfleet-client.cjs'),
    },
  },
});
