/**
 * Which pgoutput protocol version to ask a publisher for, by its server_version_num:
 * 10–13 → 1, 14 → 2 (streaming), 15 → 3 (two-phase), 16+ → 4 (parallel streaming).
 * Always the highest the publisher speaks, as the native subscriber does.
 */
import { SourceSetupError } from '../errors.js';

export function protoVersionFor(serverVersionNum: number): 1 | 2 | 3 | 4 {
  if (serverVersionNum < 100000) {
    throw new SourceSetupError(`publisher server_version_num ${serverVersionNum} is older than PostgreSQL 10, which has no pgoutput`);
  }
  if (serverVersionNum >= 160000) return 4;
  if (serverVersionNum >= 150000) return 3;
  if (serverVersionNum >= 140000) return 2;
  return 1;
}
