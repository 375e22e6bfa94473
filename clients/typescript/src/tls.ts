// TLS to nodes that serve their HTTP and gRPC ports with `--tls-cert`: what the client trusts
// (a CA's PEM, or Node's roots), the name it checks the nodes' certificates against, and the
// gRPC credentials and HTTPS requests made with them.
//
// The nodes ask for no client certificate on those ports (a client proves who it is with its
// token), so there is no client certificate here.
import * as grpc from '@grpc/grpc-js';
import { readFileSync } from 'node:fs';
import * as https from 'node:https';
import { ConfigError } from './errors.js';

export interface TlsOptions {
  /** The CA of the nodes' certificates: PEM (a string or a Buffer), or a PEM file's path.
   * Default: Node's root certificates. */
  ca?: string | Buffer;
  /** The name every member's certificate is checked against (and sent as SNI), whatever
   * address it is dialed at: for certificates that name a host while members advertise IPs.
   * Default: the address dialed (a member's IP must then be in its certificate). */
  serverName?: string;
}

/** A client's TLS, loaded. */
export interface Tls {
  ca: Buffer | undefined;
  serverName: string | undefined;
  credentials: grpc.ChannelCredentials;
}

const PEM_CERT = '-----BEGIN CERTIFICATE-----';

/** Reads `opts` (the CA's file, if it names one); ConfigError when it cannot work. */
export function loadTls(opts: TlsOptions): Tls {
  if (opts === null || typeof opts !== 'object') throw new ConfigError('tls: give an object ({ ca, serverName })');
  if ('cert' in opts || 'key' in opts) {
    throw new ConfigError('tls: the nodes ask for no client certificate on their HTTP and gRPC ports: leave out cert and key (a client authenticates with `token`)');
  }
  let ca: Buffer | undefined;
  if (typeof opts.ca === 'string' && !opts.ca.trimStart().startsWith('-----BEGIN')) {
    try {
      ca = readFileSync(opts.ca);
    } catch (e) {
      throw new ConfigError(`tls.ca ${JSON.stringify(opts.ca)}: cannot read it: ${(e as Error).message}`);
    }
  } else if (typeof opts.ca === 'string') {
    ca = Buffer.from(opts.ca);
  } else if (Buffer.isBuffer(opts.ca)) {
    ca = opts.ca;
  } else if (opts.ca !== undefined) {
    throw new ConfigError('tls.ca: give PEM (a string or a Buffer) or a file path');
  }
  if (ca !== undefined && !ca.includes(PEM_CERT)) throw new ConfigError('tls.ca holds no PEM certificate');
  if (opts.serverName !== undefined && (typeof opts.serverName !== 'string' || !opts.serverName)) throw new ConfigError('tls.serverName: give a host name');
  let credentials: grpc.ChannelCredentials;
  try {
    credentials = grpc.credentials.createSsl(ca ?? null);
  } catch (e) {
    throw new ConfigError(`tls.ca: not a usable PEM bundle: ${(e as Error).message}`);
  }
  return { ca, serverName: opts.serverName, credentials };
}

/** gRPC channel options that `tls` adds. */
export function channelOptions(tls: Tls | undefined): grpc.ChannelOptions {
  return tls?.serverName ? { 'grpc.ssl_target_name_override': tls.serverName } : {};
}

/** GET a JSON document over HTTPS within `timeoutMs` (fetch takes no CA of its own). */
export function httpsJson<T>(url: string, timeoutMs: number, tls: Tls): Promise<T> {
  return new Promise((resolve, reject) => {
    const options: https.RequestOptions = {
      // One connection per discovery request: they are seconds apart.
      agent: false,
      headers: { accept: 'application/json' },
      signal: AbortSignal.timeout(timeoutMs),
    };
    if (tls.ca) options.ca = tls.ca;
    if (tls.serverName) options.servername = tls.serverName;
    const req = https.get(url, options, (res) => {
      const status = res.statusCode ?? 0;
      if (status < 200 || status >= 300) {
        res.resume();
        reject(new Error(`${url}: HTTP ${status}`));
        return;
      }
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        try {
          resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')) as T);
        } catch (e) {
          reject(e);
        }
      });
    });
    req.on('error', reject);
  });
}
