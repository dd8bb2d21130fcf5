// Drives the console's read-only views in headless Chromium: sign in, read
// the approvals page's refresh, the decision trail with its default filter
// and with "show initialize and notifications", and the credential, caller
// and connection pages; keep a screenshot of each. Prints one JSON line of
// what the pages showed for the Rust test (tests/it/console_views.rs).
//
//   node tests/ui/views.mjs BASE_URL ADMIN_TOKEN SCREENSHOT_DIR
import { chromium } from 'playwright-core';

const [base, token, dir] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(`${base}/ui/decisions`);
  await page.fill('input[name=token]', token);
  await Promise.all([page.waitForURL(`${base}/ui`), page.click('button[type=submit]')]);
  const refresh = await page.locator('meta[http-equiv=refresh]').getAttribute('content');
  const texts = async (sel) => (await page.locator(sel).allInnerTexts()).join('\n');
  const seen = { refresh };
  await page.click('nav >> text=Decisions');
  seen.quiet = await texts('#audit');
  await page.screenshot({ path: `${dir}/decisions.png`, fullPage: true });
  await page.check('input[name=all]');
  await Promise.all([page.waitForLoadState('load'), page.click('#filter button[type=submit]')]);
  seen.all = await texts('#audit');
  seen.allUrl = page.url();
  seen.older = await page.locator('#older').count();
  for (const view of ['Credentials', 'Callers', 'Connections']) {
    await page.click(`nav >> text=${view}`);
    seen[view] = await texts('#listing');
    await page.screenshot({ path: `${dir}/${view.toLowerCase()}.png`, fullPage: true });
  }
  seen.scripts = await page.evaluate(() => document.scripts.length);
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
