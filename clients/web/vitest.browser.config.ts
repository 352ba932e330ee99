// The same unit tests in a real browser: Debian's Chromium (never a tool's own download),
// headless, through Playwright. `make test-e2e` runs it (tests/e2e/test_web_units_in_chromium.py);
// `npm test` runs them under Node in the gate. The React binding's tests (*.test.tsx) run here
// only: react-dom needs a DOM, and the browser's is the real one.
import { playwright } from '@vitest/browser-playwright';
import { defineConfig } from 'vitest/config';

const chromium = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

export default defineConfig({
  test: {
    include: ['test/**/*.test.{ts,tsx}'],
    restoreMocks: true,
    browser: {
      enabled: true,
      headless: true,
      screenshotFailures: false,
      provider: playwright({
        launchOptions: { executablePath: chromium, args: ['--no-sandbox'] },
      }),
      instances: [{ browser: 'chromium' }],
    },
  },
});
