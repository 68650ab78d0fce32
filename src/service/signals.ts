/**
 * SIGTERM/SIGINT: stop reading, roll back the in-flight target transaction, send a last
 * feedback and exit 0 (systemd's KillSignal, Ctrl-C). A second signal exits at once;
 * nothing is lost by that either, since progress only ever advances with a commit.
 */
import type { Logger } from '../log.js';

export function installStopSignals(log: Logger, stop: () => void): void {
  let signalled = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (signalled) {
      log.warn({ signal }, 'second signal; exiting now');
      process.exit(1);
    }
    signalled = true;
    log.info({ signal }, 'stopping');
    stop();
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}
