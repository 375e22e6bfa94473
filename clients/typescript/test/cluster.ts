// A real ringlimit cluster for the integration tests: `ringlimit serve` processes started from
// the binary at $RINGLIMIT_BIN on loopback with ephemeral ports, their HTTP and gRPC addresses
// read from their logs, killed (SIGKILL) and reaped when the test ends (and when this process
// exits, whatever happens).
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { closedPort } from './helpers.js';

export const BIN = process.env.RINGLIMIT_BIN ?? '';

/** Why the cluster tests are skipped, or false. */
export const SKIP: string | false = BIN ? false : 'RINGLIMIT_BIN is not set: no ringlimit binary to start a cluster from (cargo test -p ringlimit-tests --test it sdk_typescript sets it)';

const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});

/** The rules every test cluster serves. */
export const RULES = `rules:
  - name: api
    limit: 10
    period: 1m
  - name: exact
    limit: 50
    period: 1m
    algorithm: fixed_window
  - name: closed
    limit: 4
    period: 1m
    on_owner_unreachable: closed
  - name: everywhere
    limit: 1000
    period: 1m
    mode: global
  - name: hot
    limit: 20000
    period: 1h
    algorithm: fixed_window
  - name: loaded
    limit: 100000
    period: 1m
`;

export interface Node {
  id: string;
  peer: string;
  http: string;
  grpc: string;
  child: ChildProcess;
  log: string[];
}

export interface ClusterOptions {
  size?: number;
  /** A cluster secret and a client token (auth tests); default: unauthenticated peers. */
  secret?: string;
  clientToken?: string;
  /** The HTTP and gRPC ports serve this certificate (`--tls-cert`, `--tls-key`). */
  tls?: Certs;
}

/** A CA and a server certificate it signed (PEM files). */
export interface Certs {
  ca: string;
  cert: string;
  key: string;
}

/** Why the TLS tests are skipped (no openssl CLI to make certificates with), or false. */
export const NO_OPENSSL: string | false = (() => {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return false;
  } catch {
    return 'no openssl CLI to make certificates with';
  }
})();

/** A CA of its own and a P-256 server certificate for `san` (`DNS:x,IP:y`) in `dir`, made with
 * the openssl CLI as the TLS guide does. */
export function makeCerts(dir: string, san: string, name: string): Certs {
  const run = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'ignore', timeout: 30_000 });
  const ca = `${name}-ca.crt`;
  const caKey = `${name}-ca.key`;
  run('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '2', '-subj', `/CN=${name} test CA`, '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign', '-keyout', caKey, '-out', ca);
  run('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.csr`);
  writeFileSync(join(dir, `${name}.ext`), `subjectAltName=${san}\nextendedKeyUsage=serverAuth\n`);
  run('x509', '-req', '-in', `${name}.csr`, '-CA', ca, '-CAkey', caKey, '-CAcreateserial', '-days', '2', '-extfile', `${name}.ext`, '-out', `${name}.crt`);
  return { ca: join(dir, ca), cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`) };
}

/** Waits for `cond` to hold, checking every 50 ms, at most `ms`. */
export async function until(what: string, cond: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export class Cluster {
  nodes: Node[] = [];
  private dir = mkdtempSync(join(tmpdir(), 'ringlimit-ts-'));
  /** The nodes' CA when they serve TLS (the test's own reads trust it and check no name). */
  private ca: Buffer | undefined;

  static async start(opts: ClusterOptions = {}): Promise<Cluster> {
    const c = new Cluster();
    try {
      await c.boot(opts);
    } catch (e) {
      c.stop();
      throw e;
    }
    return c;
  }

  private async boot(opts: ClusterOptions): Promise<void> {
    const size = opts.size ?? 3;
    if (opts.tls) this.ca = readFileSync(opts.tls.ca);
    const rules = join(this.dir, 'rules.yaml');
    writeFileSync(rules, RULES);
    const peers: string[] = [];
    for (let i = 0; i < size; i++) peers.push(`127.0.0.1:${await closedPort()}`);
    const started = peers.map((peer, i) => this.spawn(`n${i}`, peer, peers, rules, opts));
    this.nodes = await Promise.all(started);
    await until(`${size} members alive on every node`, async () => {
      const views = await Promise.all(this.nodes.map((n) => this.cluster(n).catch(() => undefined)));
      return views.every((v) => v !== undefined && v.members.filter((m) => m.state === 'alive').length === size);
    });
  }

  private spawn(id: string, peer: string, peers: string[], rules: string, opts: ClusterOptions): Promise<Node> {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('RINGLIMIT_')) env[k] = v;
    env.RUST_LOG = 'info';
    env.NO_COLOR = '1';
    if (opts.secret) env.RINGLIMIT_CLUSTER_SECRET = opts.secret;
    else env.RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS = 'true';
    if (opts.clientToken) env.RINGLIMIT_CLIENT_TOKEN = opts.clientToken;
    const args = ['serve', '--node-id', id, '--http', '127.0.0.1:0', '--peer', peer, '--grpc', '127.0.0.1:0', '--seeds', peers.join(','), '--config', rules];
    if (opts.tls) args.push('--tls-cert', opts.tls.cert, '--tls-key', opts.tls.key);
    const child = spawn(BIN, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    children.add(child);
    child.once('exit', () => children.delete(child));
    const node: Node = { id, peer, http: '', grpc: '', child, log: [] };
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${id} did not log its addresses within 20 s:\n${node.log.join('\n')}`)), 20_000);
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`${id} exited (${code}) before serving:\n${node.log.join('\n')}`));
      });
      createInterface({ input: child.stderr! }).on('line', (line) => {
        node.log.push(line);
        if (node.log.length > 2_000) node.log.shift();
        if (line.includes('ringlimit node serving')) node.http = /\shttp=(\S+)/.exec(line)?.[1] ?? '';
        if (line.includes('gRPC serving')) node.grpc = /\sgrpc=(?:Some\()?([0-9.:]+)/.exec(line)?.[1] ?? '';
        if (node.http && node.grpc) {
          clearTimeout(timer);
          resolve(node);
        }
      });
    });
  }

  /** The node's `GET /v1/cluster`. */
  async cluster(n: Node): Promise<{ members: Array<{ node_id: string; state: string; grpc_addr?: string }> }> {
    return JSON.parse(await this.get(`/v1/cluster`, n)) as { members: Array<{ node_id: string; state: string; grpc_addr?: string }> };
  }

  /** A GET of the node's HTTP port (HTTPS when it serves TLS). */
  private async get(path: string, n: Node): Promise<string> {
    if (!this.ca) {
      const res = await fetch(`http://${n.http}${path}`, { signal: AbortSignal.timeout(2_000) });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      return res.text();
    }
    const ca = this.ca;
    return new Promise((resolve, reject) => {
      const opts = { ca, agent: false, checkServerIdentity: () => undefined, signal: AbortSignal.timeout(2_000) };
      https
        .get(`https://${n.http}${path}`, opts, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (body += c));
          res.on('error', reject);
          res.on('end', () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`HTTP ${res.statusCode}`))));
        })
        .on('error', reject);
    });
  }

  /** Whether members advertise their gRPC addresses (a node with ringlimit.v1's SDK calls). */
  async advertisesGrpc(): Promise<boolean> {
    const v = await this.cluster(this.nodes[0]!);
    return v.members.every((m) => typeof m.grpc_addr === 'string' && m.grpc_addr.length > 0);
  }

  /** A counter of the node's `/metrics`, summed over its labels. */
  async metric(n: Node, name: string): Promise<number> {
    const text = await this.get('/metrics', n);
    let sum = 0;
    for (const line of text.split('\n')) {
      if (line.startsWith(`${name} `) || line.startsWith(`${name}{`)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
    }
    return sum;
  }

  /** A counter summed over every node still running. */
  async total(name: string): Promise<number> {
    const alive = this.nodes.filter((n) => n.child.exitCode === null && n.child.signalCode === null);
    const values = await Promise.all(alive.map((n) => this.metric(n, name)));
    return values.reduce((a, b) => a + b, 0);
  }

  seeds(): string[] {
    return this.nodes.map((n) => `${this.ca ? 'https' : 'http'}://${n.http}`);
  }

  /** SIGKILLs a node and waits until it is gone. */
  async kill(n: Node): Promise<void> {
    if (n.child.exitCode !== null || n.child.signalCode !== null) return;
    const gone = new Promise((r) => n.child.once('exit', r));
    n.child.kill('SIGKILL');
    await gone;
  }

  logs(): string {
    return this.nodes.map((n) => `--- ${n.id}\n${n.log.slice(-40).join('\n')}`).join('\n');
  }

  stop(): void {
    for (const n of this.nodes) n.child.kill('SIGKILL');
    rmSync(this.dir, { recursive: true, force: true });
  }
}
