/**
 * KernelLink: the sidebar's connection to forge_nb in one notebook's kernel.
 *
 * It probes the kernel (one silent execute request, see `PROBE`), opens the comm when forge_nb is
 * there, keeps the last state the kernel pushed, sends actions, and starts over when the kernel
 * restarts or is changed. Nothing here throws: a lost kernel is a phase, not an error.
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  Action,
  IAttachable,
  ISession,
  KernelMessage as ForgeMessage,
  PROBE,
  PROTOCOL,
  TARGET
} from './protocol';

/**
 * Where the link stands:
 * - `no-kernel`: the notebook has no live kernel;
 * - `connecting`: probing the kernel or waiting for its first state;
 * - `restarting`: the kernel restarts (the comm is gone with it);
 * - `unavailable`: forge_nb is not loaded in the kernel (or it is not a Python kernel);
 * - `open`: the comm is open; `session` is null when no session is up.
 */
export type Phase = 'no-kernel' | 'connecting' | 'restarting' | 'unavailable' | 'open';

/** The outcome of the last action, one line. */
export interface INote {
  ok: boolean;
  text: string;
}

export class KernelLink implements IDisposable {
  constructor(private readonly _context: ISessionContext) {
    _context.kernelChanged.connect(this._onKernelChanged, this);
    _context.statusChanged.connect(this._onStatus, this);
    _context.connectionStatusChanged.connect(this._onConnection, this);
    void _context.ready.then(
      () => this._onKernelChanged(),
      () => this._setPhase('no-kernel')
    );
  }

  /** Emitted whenever anything shown changes (at most as often as the kernel pushes states). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get phase(): Phase {
    return this._phase;
  }

  get session(): ISession | null {
    return this._phase === 'open' ? this._session : null;
  }

  /** This notebook's session, running in its server, when this kernel holds none. */
  get attachable(): IAttachable | null {
    return this._phase === 'open' && this._session === null ? this._attachable : null;
  }

  /** Actions sent and not answered yet. */
  get pending(): ReadonlySet<Action> {
    return this._pending;
  }

  get note(): INote | null {
    return this._note;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Probe again unless the comm is open (the "Check again" button, or a cell that ran). */
  retry(): void {
    if (this._phase !== 'open') {
      void this._probe();
    }
  }

  /**
   * A cell of this notebook finished: if forge_nb was not there, look again when the cell may
   * have loaded it (its source mentions forge), so that other notebooks see no extra requests.
   */
  cellExecuted(source: string): void {
    if (this._phase === 'unavailable' && /forge/i.test(source)) {
      this.retry();
    }
  }

  /** Ask the kernel to `sync`, `run`, `pause`, `resume` or `attach`; a note follows its answer. */
  act(action: Action): void {
    const comm = this._comm;
    if (!comm || this._pending.has(action)) {
      return;
    }
    const id = ++this._nextId;
    this._pending.add(action);
    try {
      comm.send({ type: 'action', id, action });
    } catch {
      this._pending.delete(action);
      this._note = { ok: false, text: `${action}: the kernel is not reachable` };
    }
    this._changed.emit();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._drop();
    Signal.clearData(this);
  }

  private _onKernelChanged(): void {
    const kernel = this._context.session?.kernel ?? null;
    if (kernel === this._kernel && this._phase !== 'no-kernel') {
      return;
    }
    this._drop();
    this._kernel = kernel;
    this._generation++;
    if (kernel) {
      void this._probe();
    } else {
      this._setPhase('no-kernel');
    }
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting') {
      this._drop();
      this._generation++;
      this._setPhase('restarting');
    } else if (status === 'dead') {
      this._drop();
      this._generation++;
      this._setPhase('no-kernel');
    } else if ((status === 'idle' || status === 'busy') && this._phase === 'restarting') {
      void this._probe();
    }
  }

  private _onConnection(_: ISessionContext, status: Kernel.ConnectionStatus): void {
    // States pushed while the websocket was down are lost: ask for the current one.
    if (status === 'connected' && this._comm) {
      this._send({ type: 'refresh' });
    }
  }

  private async _probe(): Promise<void> {
    if (this._disposed) {
      return;
    }
    if (this._probing) {
      this._reprobe = true;
      return;
    }
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed) {
      this._setPhase('no-kernel');
      return;
    }
    const generation = this._generation;
    this._probing = true;
    this._setPhase('connecting');
    try {
      const info = await kernel.info;
      if (info.language_info.name !== 'python') {
        this._setPhase('unavailable');
        return;
      }
      const future = kernel.requestExecute({
        code: '',
        silent: true,
        store_history: false,
        allow_stdin: false,
        stop_on_error: false,
        user_expressions: { forge: PROBE }
      });
      const reply = (await future.done) as KernelMessage.IExecuteReplyMsg;
      if (generation !== this._generation || this._disposed) {
        return;
      }
      if (probeAnswer(reply) === 'ready') {
        this._open(kernel);
      } else {
        this._setPhase('unavailable');
      }
    } catch {
      // The kernel went away mid-probe; its status change says what comes next.
      if (generation === this._generation && !this._disposed) {
        this._setPhase('unavailable');
      }
    } finally {
      this._probing = false;
      if (this._reprobe && !this._disposed) {
        this._reprobe = false;
        this.retry();
      }
    }
  }

  private _open(kernel: Kernel.IKernelConnection): void {
    const comm = kernel.createComm(TARGET);
    this._comm = comm;
    comm.onMsg = msg => this._onMessage(comm, msg);
    comm.onClose = () => {
      // The kernel closed it (forge_nb gone) or the kernel went away.
      if (this._comm === comm) {
        this._comm = null;
        this._pending.clear();
        this._setPhase('unavailable');
      }
    };
    try {
      comm.open({ protocol: PROTOCOL }).done.catch(() => undefined);
    } catch {
      this._comm = null;
      this._setPhase('unavailable');
    }
  }

  private _onMessage(comm: Kernel.IComm, msg: KernelMessage.ICommMsgMsg): void {
    if (comm !== this._comm) {
      return;
    }
    const data = msg.content.data as unknown as ForgeMessage;
    if (data.type === 'state') {
      this._session = data.session ?? null;
      this._attachable = data.attachable ?? null;
      this._phase = 'open';
      if (data.protocol !== PROTOCOL) {
        this._note = {
          ok: false,
          text: `forge_nb speaks protocol ${data.protocol}, this sidebar ${PROTOCOL}`
        };
      }
    } else if (data.type === 'result') {
      this._pending.delete(data.action);
      // Run / Pause / Resume show in the run state line; their note would only repeat it (or go stale).
      const quiet = data.ok && data.action !== 'sync' && data.action !== 'attach';
      this._note = quiet
        ? null
        : { ok: data.ok, text: `${LABELS[data.action] ?? data.action}: ${data.message}` };
    } else {
      return;
    }
    this._changed.emit();
  }

  private _send(data: { type: string }): void {
    try {
      this._comm?.send(data as any);
    } catch {
      // The kernel is gone; its status change resets the link.
    }
  }

  /** Forget the comm (closing it if the kernel is still there) and what it said. */
  private _drop(): void {
    const comm = this._comm;
    this._comm = null;
    this._session = null;
    this._pending.clear();
    this._note = null;
    if (comm && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // The kernel is already gone.
      }
    }
  }

  private _setPhase(phase: Phase): void {
    this._phase = phase;
    if (phase !== 'open') {
      this._session = null;
    }
    if (!this._disposed) {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _phase: Phase = 'connecting';
  private _session: ISession | null = null;
  private _attachable: IAttachable | null = null;
  private _pending = new Set<Action>();
  private _note: INote | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _generation = 0;
  private _probing = false;
  private _reprobe = false;
  private _nextId = 0;
  private _disposed = false;
}

const LABELS: Record<Action, string> = {
  sync: 'Sync',
  run: 'Run',
  pause: 'Pause',
  resume: 'Resume',
  attach: 'Attach'
};

/** The probe's answer ("ready", "absent", "no-kernel") from an execute reply, or '' if none. */
function probeAnswer(reply: KernelMessage.IExecuteReplyMsg): string {
  const content = reply.content;
  if (content.status !== 'ok') {
    return '';
  }
  const result = content.user_expressions?.['forge'] as
    { status?: string; data?: { 'text/plain'?: string } } | undefined;
  const text = result?.status === 'ok' ? (result.data?.['text/plain'] ?? '') : '';
  return text.replace(/^['"]|['"]$/g, '');
}
