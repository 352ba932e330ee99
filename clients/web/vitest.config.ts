import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node',
    // A leaked timer or an unhandled rejection fails the run.
    restoreMocks: true,
  },
});
