// The library build: one ES module with no dependencies, dist/lib/streamfleet-client.js
// (declarations come from tsc -p tsconfig.lib.json into dist/lib/types).
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
      formats: ['es'],
      fileName: () => 'streamfleet-client.js',
    },
  },
});
