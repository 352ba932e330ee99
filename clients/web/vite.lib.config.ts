// The library build: two entries, each as an ES module and as CommonJS, unminified (the
// application's bundler minifies): the core client (dist/lib/streamfleet-client.{js,cjs}), which
// imports nothing, and the React binding (dist/lib/streamfleet-react.{js,cjs}), which imports
// only react (a peer dependency; the binding takes nothing but types from the core, so no chunk
// is shared and the core is the same with or without it). Declarations come from
// tsc -p tsconfig.lib.json into dist/lib/types, and scripts/package-lib.mjs copies them as
// .d.cts for require().
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));

export default defineConfig({
  build: {
    outDir: 'dist/lib',
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: true,
    minify: false,
    lib: {
      entry: {
        'streamfleet-client': here('./src/client/index.ts'),
        'streamfleet-react': here('./src/client/react.ts'),
      },
      formats: ['es', 'cjs'],
      fileName: (format, entry) => `${entry}.${format === 'es' ? 'js' : 'cjs'}`,
    },
    rolldownOptions: {
      external: ['react'],
    },
  },
});
