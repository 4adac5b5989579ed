// Opens pages in headless Chromium one after the other, each in a new browser context (its own process) with the
// HTTP cache off, and prints what each set as window.benchResult (JSON, one list); for `python -m bench.portable`.
// Usage: node pages.mjs <urls.json> [timeout seconds per page] [chromium path]
import {readFile} from 'node:fs/promises';
import puppeteer from 'puppeteer-core';

const [urlsFile, timeout = '300', executablePath = process.env.CHROMIUM || '/usr/bin/chromium'] =
  process.argv.slice(2);
const urls = JSON.parse(await readFile(urlsFile, 'utf8'));
const browser = await puppeteer.launch({executablePath, headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage']});
const results = [];
try {
  for (const url of urls) {
    const context = await browser.createBrowserContext();
    const page = await context.newPage();
    await page.setCacheEnabled(false);
    const problems = [];
    page.on('pageerror', (err) => problems.push(err.message));
    await page.goto(url);
    const deadline = Date.now() + Number(timeout) * 1000;
    for (;;) {
      const state = await page.evaluate(() => ({result: window.benchResult, error: window.benchError}));
      if (state.error || problems.length) throw new Error(`${url}: ${state.error || problems.join('\n')}`);
      if (state.result) {
        results.push(state.result);
        break;
      }
      if (Date.now() > deadline) throw new Error(`${url}: no result after ${timeout} s`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await context.close();
  }
  console.log(JSON.stringify(results));
} catch (err) {
  console.error(err.message);
  process.exitCode = 1;
} finally {
  await browser.close();
}
