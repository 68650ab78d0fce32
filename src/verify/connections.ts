/**
 * The connections verify compares and repairs on: plain clients (not the apply's wire)
 * started with the session settings the normalised row text relies on (sql.ts
 * SESSION_OPTIONS), rows read as arrays of text.
 */
import pg from 'pg';
import type { ConnInfo } from '../config/conninfo.js';
import { pgClientConfig } from '../config/conninfo.js';
import type { SideConnection } from './compare.js';
import { SESSION_OPTIONS } from './sql.js';

/** A connection of the comparison: a plain client with the session settings normalisation relies on. */
export async function openSide(info: ConnInfo, applicationName: string, extraOptions = ''): Promise<pg.Client> {
  const client = new pg.Client(pgClientConfig(info, applicationName, { options: `${SESSION_OPTIONS}${extraOptions}` }));
  client.on('error', () => {});
  await client.connect();
  return client;
}

export function sideConnection(client: pg.Client): SideConnection {
  return { rows: async (q) => (await client.query({ text: q.text, values: q.params, rowMode: 'array' })).rows as (string | null)[][] };
}
