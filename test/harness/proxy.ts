/**
 * A TCP proxy on loopback for fault tests: forwards bytes between pgsub and a server,
 * and can black-hole existing connections (bytes read and dropped both ways, sockets
 * kept open — a silent network) or cut them (reset), while new connections pass.
 */
import net from 'node:net';

export interface Proxy {
  port: number;
  /** Connections opened so far. */
  connections(): number;
  /** Silence every open connection: nothing flows, nothing closes. */
  blackhole(): void;
  /** Reset every open connection. */
  cut(): void;
  close(): Promise<void>;
}

interface Pair {
  client: net.Socket;
  server: net.Socket;
  silent: boolean;
}

export async function startProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<Proxy> {
  const pairs = new Set<Pair>();
  let opened = 0;
  const server = net.createServer((client) => {
    opened++;
    const upstream = net.connect(targetPort, targetHost);
    const pair: Pair = { client, server: upstream, silent: false };
    pairs.add(pair);
    const forward = (from: net.Socket, to: net.Socket) => {
      from.on('data', (chunk) => {
        if (!pair.silent && !to.destroyed) to.write(chunk);
      });
      from.on('close', () => {
        pairs.delete(pair);
        to.destroy();
      });
      from.on('error', () => to.destroy());
    };
    forward(client, upstream);
    forward(upstream, client);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    connections: () => opened,
    blackhole() {
      for (const p of pairs) p.silent = true;
    },
    cut() {
      for (const p of pairs) {
        p.client.resetAndDestroy();
        p.server.resetAndDestroy();
      }
      pairs.clear();
    },
    async close() {
      for (const p of pairs) {
        p.client.destroy();
        p.server.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
