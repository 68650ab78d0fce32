/**
 * The connections verify compares and repairs on: plain clients (not the apply's wire)
 * started with the session settings the normalised row text relies on (sql.ts
 * SESSION_OPTIONS), rows read as arrays of text.
 */
import type pg from 'pg';
import type { ConnInfo } from '../config/conninfo.js';
import { connectPgClient } from '../connect/drivers.js';
import type { Side } from '../errors.js';
import type { SideConnection } from './compare.js';
import { SESSION_OPTIONS } from './sql.js';

/** A connection of the comparison: a plain client with the session settings normalisation relies on. */
export async function openSide(side: Side, info: ConnInfo, applicationName: string, extraOptions = ''): Promise<pg.Client> {
  return connectPgClient(info, { side, purpose: 'apply', what: 'a connection', applicationName, options: `${SESSION_OPTIONS}${extraOptions}` });
}

export function sideConnection(client: pg.Client): SideConnection {
  return { rows: async (q) => (await client.query({ text: q.text, values: q.params, rowMode: 'array' })).rows as (string | null)[][] };
}
