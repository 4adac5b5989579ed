// Opens a page in headless Chromium (Debian's chromium, driven by puppeteer-core) and waits until it sets
// window.ortflowResult (printed as JSON) or window.ortflowError / an uncaught page error (exit 1).
// Usage: node browser.mjs <url> [timeout seconds] [chromium path]; ORTFLOW_CHROMIUM_FLAGS (space-separated) adds
// Chromium flags (`--enable-unsafe-webgpu`: WebGPU, a software adapter where there is no GPU). The printed result
// holds the page's console errors as `consoleErrors`.
import puppeteer from 'puppeteer-core';

const [url, timeout = '120', executablePath = process.env.CHROMIUM || '/usr/bin/chromium'] = process.argv.slice(2);
const browser = await puppeteer.launch({executablePath, headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
    ...(process.env.ORTFLOW_CHROMIUM_FLAGS || '').split(' ').filter(Boolean)]});
const problems = [];
try {
  const page = await browser.newPage();
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  page.on('requestfailed', (req) => problems.push(`request failed: ${req.url()} ${req.failure()?.errorText}`));
  await page.goto(url);
  const deadline = Date.now() + Number(timeout) * 1000;
  for (;;) {
    const state = await page.evaluate(() => ({result: window.ortflowResult, error: window.ortflowError}));
    if (state.error) throw new Error(`the page failed: ${state.error}`);
    if (state.result) {
      console.log(JSON.stringify({...state.result, userAgent: await browser.version(),
        consoleErrors: problems.filter((p) => p.startsWith('console: ')).map((p) => p.slice(9)),
        log: await page.$eval('#log', (e) => e.textContent)}));
      break;
    }
    if (problems.some((p) => p.startsWith('page error'))) throw new Error(problems.join('\n'));
    if (Date.now() > deadline) throw new Error(`no result after ${timeout} s\n${problems.join('\n')}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
} catch (err) {
  console.error(err.message, problems.join('\n'));
  process.exitCode = 1;
} finally {
  await browser.close();
}
