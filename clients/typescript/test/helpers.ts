// What the tests share.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The package's root (clients/typescript), from the compiled test's place in dist/test/. */
export function packageRoot(): string {
  return join(dirname(fileURLToPath(import.meta.url)), '..', '..');
}

/** A loopback port just closed: connections to it are refused at once. */
export async function closedPort(): Promise<number> {
  const net = await import('node:net');
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}
