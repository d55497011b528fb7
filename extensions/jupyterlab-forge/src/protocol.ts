/**
 * The comm protocol between the sidebar and forge_nb in the kernel. The reference is the
 * docstring of `forge_nb/notebook/sidebar.py`; these types mirror it.
 */

/** The comm target forge_nb registers in the kernel. */
export const TARGET = 'forge_nb.sidebar';

/** The protocol version this frontend speaks. */
export const PROTOCOL = 2;

/**
 * The user expression of the probe (a silent execute request): registers the comm target in a
 * kernel whose environment has forge_nb (importing its light sidebar module) and answers 'ready'.
 * A copy of `sidebar.PROBE`.
 */
export const PROBE =
  "__import__('forge_nb.notebook.sidebar', fromlist=['probe']).probe() " +
  "if __import__('importlib.util', fromlist=['find_spec']).find_spec('forge_nb') else 'absent'";

/** The health of one role's procs. */
export type Health = 'alive' | 'degraded' | 'dead' | 'remote';

export interface IActor {
  role: string;
  pids: number[];
  health: Health;
  /** The placement plan's GPUs of each proc (empty: the CPU), in proc order. */
  devices: number[][];
  /** The host of each proc, in proc order. */
  hosts: string[];
}

export interface IRun {
  state: 'running' | 'paused' | 'finished' | 'failed';
  steps_done: number;
  error: string | null;
}

/** One session, as the kernel describes it. */
export interface ISession {
  /** The session's name (`forge-nb ps`); it lives in a server of its own. */
  name: string;
  /** Clients attached to it now (this kernel among them). */
  clients: number;
  mesh: string;
  slurm_job: string | null;
  engine: string;
  actors: IActor[];
  /** Trained batches. */
  steps: number;
  samples: number;
  /** Policy versions; staleness = trainer - generator. */
  policy: { trainer: number; generator: number; staleness: number };
  reward_version: number;
  loss_version: number;
  run: IRun | null;
  /** Generated tokens per second of generation, one value per trained step, oldest first. */
  tokens_per_s: { last: number | null; history: number[] };
}

export interface IStateMessage {
  type: 'state';
  protocol: number;
  /** Unix seconds. */
  time: number;
  session: ISession | null;
  /** With no session in this kernel: this notebook's session, still running in its server. */
  attachable: IAttachable | null;
}

/** A session this kernel can attach to (after a kernel restart). */
export interface IAttachable {
  name: string;
  steps: number;
  run: string | null;
}

export interface IResultMessage {
  type: 'result';
  id: number;
  action: Action;
  ok: boolean;
  message: string;
}

export type KernelMessage = IStateMessage | IResultMessage;

export type Action = 'sync' | 'run' | 'pause' | 'resume' | 'attach';
