// The checked-in types of src/gen/ are what the proto gives: regenerated into a temporary
// directory and compared (scripts/gen.mjs --check).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { packageRoot } from './helpers.js';

test('regenerating the types from the proto gives the checked-in files', () => {
  const r = spawnSync(process.execPath, [join(packageRoot(), 'scripts', 'gen.mjs'), '--check'], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /src\/gen matches the proto/);
});

test('the package\'s proto is the node\'s (crates/proto), when built inside the repository', (t) => {
  const ours = join(packageRoot(), 'proto', 'ringlimit', 'v1', 'ratelimiter.proto');
  const node = join(packageRoot(), '..', '..', 'crates', 'proto', 'proto', 'ringlimit', 'v1', 'ratelimiter.proto');
  if (!existsSync(node)) {
    t.skip('not inside the ringlimit repository');
    return;
  }
  assert.equal(readFileSync(ours, 'utf8'), readFileSync(node, 'utf8'), 'copy crates/proto\'s ratelimiter.proto into proto/ and run npm run gen');
});
