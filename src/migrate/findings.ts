/**
 * A preflight finding: how serious it is (a blocker stops the migration, a warning costs
 * or loses something, an info is worth knowing), which side it is about, the object it
 * names, what was found, and the remediation — SQL where there is one. Codes are stable
 * (tests and scripts match on them; `pgsub preflight --json`).
 */
export type Severity = 'blocker' | 'warning' | 'info';

export interface Finding {
  severity: Severity;
  code: string;
  side: 'source' | 'target' | 'pair';
  object: string;
  message: string;
  remediation: string | null;
}

export class Findings {
  readonly list: Finding[] = [];

  add(severity: Severity, code: string, side: Finding['side'], object: string, message: string, remediation: string | null = null): void {
    this.list.push({ severity, code, side, object, message, remediation });
  }

  blocker(code: string, side: Finding['side'], object: string, message: string, remediation: string | null = null): void {
    this.add('blocker', code, side, object, message, remediation);
  }

  warning(code: string, side: Finding['side'], object: string, message: string, remediation: string | null = null): void {
    this.add('warning', code, side, object, message, remediation);
  }

  info(code: string, side: Finding['side'], object: string, message: string, remediation: string | null = null): void {
    this.add('info', code, side, object, message, remediation);
  }
}

/** An identifier as SQL takes it in a remediation: bare when it can be, quoted otherwise. */
export function ident(name: string): string {
  return /^[a-z_][a-z0-9_$]*$/.test(name) ? name : `"${name.replace(/"/g, '""')}"`;
}

export function qualified(schema: string, name: string): string {
  return `${ident(schema)}.${ident(name)}`;
}
