// Drives the console as an approver and as an admin, in headless Chromium:
// the approver signs in, sees the held call with its arguments and expiry,
// the page's self-refresh, the recent decisions without the protocol's own
// calls (then with them, then the older page), is refused the admin views,
// keeps a screenshot and grants the call; an admin then sees the read-only
// credentials, callers and connections. Prints one JSON line for the Rust
// test (tests/it/console.rs) to check.
//
//   node tests/ui/views.mjs BASE_URL APPROVER_TOKEN ADMIN_TOKEN TOOL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [base, approver, admin, tool, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const methods = (page) => page.$$eval('#audit tr[data-audit] td:nth-child(4)', (tds) => tds.map((td) => td.innerText));
const signIn = async (context, token) => {
  const page = await context.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(`${base}/ui/login`);
  await page.fill('input[name=token]', token);
  await Promise.all([page.waitForURL(`${base}/ui`), page.click('button[type=submit]')]);
  return page;
};
try {
  const out = {};
  const a = await browser.newContext();
  const page = await signIn(a, approver);
  const row = page.locator('#pending tr', { hasText: tool });
  await row.waitFor();
  out.rowText = await row.innerText();
  out.refresh = await page.$eval('meta[http-equiv=refresh]', (m) => m.content);
  out.nav = await page.$eval('nav', (n) => n.innerText);
  out.defaultMethods = await methods(page);
  await page.screenshot({ path: screenshot, fullPage: true });
  await Promise.all([page.waitForURL(/all_methods=1/), (async () => {
    await page.check('#filter input[name=all_methods]');
    await page.click('#filter button[type=submit]');
  })()]);
  out.allMethods = await methods(page);
  await Promise.all([page.waitForURL(/decisions_before=/), page.click('#older')]);
  out.olderUrl = page.url();
  out.olderMethods = await methods(page);
  out.adminViewStatus = (await page.goto(`${base}/ui/credentials`)).status();
  await page.goto(`${base}/ui`);
  await Promise.all([page.waitForLoadState('load'), page.locator('#pending tr', { hasText: tool }).locator('button.grant').click()]);
  await page.locator('#none').waitFor();
  out.scripts = await page.evaluate(() => document.scripts.length);
  await a.close();

  const b = await browser.newContext();
  const adminPage = await signIn(b, admin);
  out.adminNav = await adminPage.$eval('nav', (n) => n.innerText);
  for (const view of ['credentials', 'callers', 'connections']) {
    await Promise.all([adminPage.waitForURL(`${base}/ui/${view}`), adminPage.click(`nav a[href="/ui/${view}"]`)]);
    out[view] = await adminPage.$eval(`#${view}`, (t) => t.innerText);
  }
  await b.close();
  console.log(JSON.stringify(out));
} finally {
  await browser.close();
}
