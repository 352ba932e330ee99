// After the library build: the declarations again as .d.cts for require() (a package of
// "type": "module" whose CommonJS entry shared the .d.ts would be typed as ES module), then
// the size budgets: each ES build as an application ships it, minified and gzipped, printed;
// above its budget the build fails.
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';
import { minifySync } from 'rolldown/experimental';

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

// The core within 8 KiB; the React binding (React itself not counted: the application has it)
// within 2 KiB, so the binding stays a thin layer over the core.
const budgets = [
  { name: 'core client', file: 'streamfleet-client.js', budget: 8 * 1024 },
  { name: 'react binding', file: 'streamfleet-react.js', budget: 2 * 1024 },
];
let over = false;
for (const { name, file, budget } of budgets) {
  const source = fs.readFileSync(path.join(lib, file), 'utf8');
  const minified = minifySync(file, source, { compress: true, mangle: true });
  if (minified.errors?.length) throw new Error(`minify ${file}: ${minified.errors[0].message}`);
  const size = zlib.gzipSync(minified.code, { level: 9 }).length;
  console.log(`${name}: ${size} bytes min+gzip (budget ${budget})`);
  if (size > budget) {
    console.error(`${name}: ${size} bytes min+gzip is over the budget of ${budget}`);
    over = true;
  }
}
if (over) process.exit(1);
