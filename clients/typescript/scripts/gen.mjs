// Generates the TypeScript types of the gRPC contract (src/gen/) from proto/ with
// @grpc/proto-loader's generator. `--check` generates into a temporary directory and exits 1
// when the checked-in files differ from what the proto gives.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const bin = join(dirname(require.resolve('@grpc/proto-loader/package.json')), 'build', 'bin', 'proto-loader-gen-types.js');

// The same options as the runtime loader (src/grpc.ts): 64-bit integers as decimal strings
// (marks are u64 nanoseconds, beyond a double), enums by name, defaults filled in, oneofs named.
export const OPTIONS = ['--longs=String', '--enums=String', '--defaults', '--oneofs', '--grpcLib=@grpc/grpc-js', '--importFileExtension=.js'];

function generate(outDir) {
  const r = spawnSync(process.execPath, [bin, ...OPTIONS, '-I', join(root, 'proto'), '-O', outDir, 'ringlimit/v1/ratelimiter.proto'], { encoding: 'utf8' });
  if (r.status !== 0) {
    process.stderr.write(r.stdout + r.stderr);
    process.exit(r.status ?? 1);
  }
  // The generator writes the proto's absolute path into each file: made relative, the output
  // is the same wherever the package is checked out.
  for (const f of files(outDir)) {
    const p = join(outDir, f);
    const text = readFileSync(p, 'utf8').split(join(root, 'proto') + '/').join('proto/');
    writeFileSync(p, text);
  }
}

function files(dir, top = dir) {
  const out = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...files(p, top));
    else out.push(relative(top, p));
  }
  return out.sort();
}

const gen = join(root, 'src', 'gen');
if (process.argv.includes('--check')) {
  const tmp = mkdtempSync(join(tmpdir(), 'ringlimit-gen-'));
  try {
    generate(tmp);
    const want = files(tmp);
    const have = files(gen);
    const differ = want.filter((f) => !have.includes(f) || readFileSync(join(tmp, f), 'utf8') !== readFileSync(join(gen, f), 'utf8'));
    const extra = have.filter((f) => !want.includes(f));
    if (differ.length || extra.length) {
      console.error(`src/gen is stale: differ ${JSON.stringify(differ)}, extra ${JSON.stringify(extra)}; run npm run gen`);
      process.exit(1);
    }
    console.log(`src/gen matches the proto (${want.length} files)`);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
} else {
  rmSync(gen, { recursive: true, force: true });
  generate(gen);
  console.log(`generated ${files(gen).length} files into src/gen`);
}
