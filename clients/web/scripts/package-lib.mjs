// After the library build: the declarations again as .d.cts for require() (a package of
// "type": "module" whose CommonJS entry shared the .d.ts would be typed as ES module), then
// the size budget: the ES build as an application ships it, minified and gzipped, at most
// BUDGET_BYTES, printed; above it the build fails.
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';
import { minifySync } from 'rolldown/experimental';

const BUDGET_BYTES = 8 * 1024;
const lib = fileURLToPath(new URL('../dist/lib/', import.meta.url));
const esmTypes = path.join(lib, 'types');
const cjsTypes = path.join(lib, 'types-cjs');

fs.rmSync(cjsTypes, { recursive: true, force: true });
fs.mkdirSync(cjsTypes);
for (const name of fs.readdirSync(esmTypes)) {
  if (!name.endsWith('.d.ts')) continue;
  const text = fs
    .readFileSync(path.join(esmTypes, name), 'utf8')
    .replace(/^\/\/# sourceMappingURL=.*$/m, '')
    .replace(/(from\s+['"]\.{1,2}\/[^'"]+)\.js(['"])/g, '$1.cjs$2');
  fs.writeFileSync(path.join(cjsTypes, name.replace(/\.d\.ts$/, '.d.cts')), text);
}

const source = fs.readFileSync(path.join(lib, 'streamfleet-client.js'), 'utf8');
const minified = minifySync('streamfleet-client.js', source, { compress: true, mangle: true });
if (minified.errors?.length) throw new Error(`minify: ${minified.errors[0].message}`);
const size = zlib.gzipSync(minified.code, { level: 9 }).length;
console.log(`core client: ${size} bytes min+gzip (budget ${BUDGET_BYTES})`);
if (size > BUDGET_BYTES) {
  console.error(`core client: ${size} bytes min+gzip is over the budget of ${BUDGET_BYTES}`);
  process.exit(1);
}
