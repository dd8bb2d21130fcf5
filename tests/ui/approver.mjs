// Drives the console as an approver (an admin token made with
// `--role approver`) in headless Chromium: sign in, see the held call with
// its approval id, expiry and arguments, see that the page reloads itself
// and that the nav offers approvals and decisions only, be refused the
// admin pages, read the decision trail, keep a screenshot, and grant the
// call with one click. Prints one JSON line for the Rust test
// (tests/it/console.rs) to check.
//
//   node tests/ui/approver.mjs BASE_URL APPROVER_TOKEN TOOL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [base, token, tool, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const out = {};
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(`${base}/ui/login`);
  await page.fill('input[name=token]', token);
  await Promise.all([page.waitForURL(`${base}/ui`), page.click('button[type=submit]')]);
  const row = page.locator('#pending tr', { hasText: tool });
  await row.waitFor();
  out.rowText = await row.innerText();
  out.expires = await row.locator('td.expires').innerText();
  out.refresh = await page.$eval('meta[http-equiv=refresh]', (m) => m.content);
  out.nav = await page.$eval('nav', (n) => n.innerText);
  await page.screenshot({ path: screenshot, fullPage: true });
  out.credentialsStatus = (await page.goto(`${base}/ui/credentials`)).status();
  out.decisionsStatus = (await page.goto(`${base}/ui/decisions`)).status();
  out.decisions = await page.$eval('#audit', (t) => t.innerText);
  await page.goto(`${base}/ui`);
  await Promise.all([page.waitForLoadState('load'),
    page.locator('#pending tr', { hasText: tool }).locator('button.grant').click()]);
  await page.locator('#none').waitFor();
  out.scripts = await page.evaluate(() => document.scripts.length);
  console.log(JSON.stringify(out));
} finally {
  await browser.close();
}
