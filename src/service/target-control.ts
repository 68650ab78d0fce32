/**
 * The service's short visits to the subscription's control row in the target
 * (conflict/control.ts), each on a maintenance connection of its own that is closed after
 * it: a `pgsub skip` taken while running, the poll for `pgsub enable`, whether a cutover
 * ended the subscription, and the record of an apply error. None of them throws: a target
 * that cannot answer is logged (or taken as "no") and the service loop (runner.ts) goes on.
 */
import type { Config } from '../config/config.js';
import { cutOverAt, forwardServiceEnds, loadControl, recordApplyError } from '../conflict/control.js';
import type { ConflictRecord } from '../conflict/report.js';
import { ApplyConflictError, ConnectionLostError, CutOverError } from '../errors.js';
import type { Logger } from '../log.js';
import { openMaintenance } from '../pgwire/connect.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { redactSecrets } from '../config/conninfo.js';
import { connectionFailure } from './error-kinds.js';
import type { SessionHandle } from './session.js';

export class TargetControl {
  readonly #appName: string;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
  ) {
    this.#appName = `pgsub_${config.subscription}`;
  }

  /** `pgsub skip` while running: the session (current when the read answers) takes the new skip LSN from the target. */
  takeSkipRequest(session: () => SessionHandle | null): void {
    const sql = openMaintenance(this.config.target, this.#appName);
    void loadControl(sql, this.config.subscription)
      .then((control) => {
        session()?.setSkipLsn(control.skipLsn);
        if (control.skipLsn !== null) this.log.info({ skipLsn: formatLsn(control.skipLsn) }, 'remote transaction to skip');
      })
      .catch((err: unknown) => this.log.warn({ err }, 'cannot read the skip request; it is taken at the next start'))
      .finally(() => sql.end({ timeout: 5 }).catch(() => {}));
  }

  /**
   * One poll of a disabled subscription: true (logged) once `pgsub enable` ran; the cutover's
   * end when a cutover disabled it for good; a failed read is "not yet".
   */
  async enabled(): Promise<boolean | CutOverError> {
    const sql = openMaintenance(this.config.target, this.#appName);
    try {
      if ((await loadControl(sql, this.config.subscription)).enabled) {
        this.log.info({ subscription: this.config.subscription }, 'subscription enabled; resuming');
        return true;
      }
      const cut = await cutOverAt(sql, this.config.subscription);
      if (cut) return forwardServiceEnds(cut.lsn);
    } catch (err) {
      this.log.debug({ err }, 'cannot read the subscription state; still waiting');
    } finally {
      await sql.end({ timeout: 5 }).catch(() => {});
    }
    return false;
  }

  /** The cutover's end of this subscription, when that is why the session stopped (else null). */
  async cutOver(err: unknown): Promise<CutOverError | null> {
    if (err instanceof CutOverError) return err;
    // A lost target is not a cutover (the next session's start asks it again), and asking a
    // silent target here would hold the retry for its connect_timeout.
    if (err instanceof ConnectionLostError && err.context.target !== undefined) return null;
    const sql = openMaintenance(this.config.target, this.#appName);
    try {
      const cut = await cutOverAt(sql, this.config.subscription);
      return cut && forwardServiceEnds(cut.lsn);
    } catch {
      return null;
    } finally {
      await sql.end({ timeout: 5 }).catch(() => {});
    }
  }

  /** Record the error in the target; returns whether the subscription is now disabled. */
  async recordError(err: unknown, failed: { finishLsn: Lsn; xid: number } | null): Promise<boolean> {
    // A lost connection is not the target's data disagreeing, and the target may be unreachable.
    if (connectionFailure(err)) return false;
    const disable = this.config.disableOnError && failed !== null;
    const e = err as { code?: unknown; message?: unknown } | null;
    const sql = openMaintenance(this.config.target, this.#appName);
    try {
      await recordApplyError(sql, this.config.subscription, {
        failed,
        code: String(e?.code ?? 'UNKNOWN'),
        message: redactSecrets(String(e?.message ?? err)),
        conflict: err instanceof ApplyConflictError ? (err.record as ConflictRecord) : null,
        disable,
      });
      return disable;
    } catch (recordErr) {
      // The target may be what failed; the error is still logged by the service loop.
      this.log.debug({ err: recordErr }, 'cannot record the apply error in the target');
      return false;
    } finally {
      await sql.end({ timeout: 5 }).catch(() => {});
    }
  }
}
