/**
 * A TCP proxy on loopback for fault tests: forwards bytes between pgsub and a server,
 * and can black-hole existing connections (bytes read and dropped both ways, sockets
 * kept open — a silent network) or cut them (reset), while new connections pass; or
 * black-hole new connections too until heal(). A silenced connection passes no close
 * either (a lost FIN, as on a dead network path): the server's backend stays until its
 * own timeouts, or proxy.close().
 */
import net from 'node:net';
import { pickPort } from './cluster.js';

export interface Proxy {
  port: number;
  /** Connections opened so far. */
  connections(): number;
  /** Silence every open connection: nothing flows, nothing closes. `newConnections`: also those opened until heal(). */
  blackhole(opts?: { newConnections?: boolean }): void;
  /** New connections pass again (silenced ones stay silent). */
  heal(): void;
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
  let silenceNew = false;
  const server = net.createServer((client) => {
    opened++;
    const upstream = net.connect(targetPort, targetHost);
    const pair: Pair = { client, server: upstream, silent: silenceNew };
    pairs.add(pair);
    const forward = (from: net.Socket, to: net.Socket) => {
      from.on('data', (chunk) => {
        if (!pair.silent && !to.destroyed) to.write(chunk);
      });
      from.on('close', () => {
        if (pair.silent) return;
        pairs.delete(pair);
        to.destroy();
      });
      from.on('error', () => {
        if (!pair.silent) to.destroy();
      });
    };
    forward(client, upstream);
    forward(upstream, client);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    void pickPort().then((port) => server.listen(port, '127.0.0.1', () => resolve()), reject);
  });
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    connections: () => opened,
    blackhole(opts = {}) {
      for (const p of pairs) p.silent = true;
      silenceNew = opts.newConnections ?? false;
    },
    heal() {
      silenceNew = false;
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
