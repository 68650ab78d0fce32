/**
 * The first byte of each pgoutput message, for code that routes raw messages without
 * decoding them (the receiver, the applier, apply lanes). The decoder switches on the same
 * bytes; proto.c's LOGICAL_REP_MSG_* names them.
 */
export const TAG = {
  BEGIN: 0x42, // 'B'
  COMMIT: 0x43, // 'C'
  ORIGIN: 0x4f, // 'O'
  RELATION: 0x52, // 'R'
  TYPE: 0x59, // 'Y'
  INSERT: 0x49, // 'I'
  UPDATE: 0x55, // 'U'
  DELETE: 0x44, // 'D'
  TRUNCATE: 0x54, // 'T'
  MESSAGE: 0x4d, // 'M'
  BEGIN_PREPARE: 0x62, // 'b'
  PREPARE: 0x50, // 'P'
  STREAM_START: 0x53, // 'S'
  STREAM_STOP: 0x45, // 'E'
} as const;
