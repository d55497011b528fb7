/**
 * ForgeModel: what the sidebar and the status-bar item show, for the active notebook.
 *
 * It follows the notebook tracker's current notebook (switching notebooks switches kernels, hence
 * sessions) and keeps one KernelLink to that notebook's kernel.
 */
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { INote, KernelLink, Phase } from './link';
import { Action, IAttachable, ISession } from './protocol';

export class ForgeModel implements IDisposable {
  constructor(private readonly _tracker: INotebookTracker) {
    _tracker.currentChanged.connect(this._follow, this);
    NotebookActions.executed.connect(this._onExecuted, this);
    this._follow();
  }

  /** Emitted whenever anything shown changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The notebook followed, or null when none is open. */
  get panel(): NotebookPanel | null {
    return this._panel;
  }

  /** `no-notebook` when none is open, else the link's phase. */
  get phase(): Phase | 'no-notebook' {
    return this._link?.phase ?? 'no-notebook';
  }

  get session(): ISession | null {
    return this._link?.session ?? null;
  }

  /** This notebook's session in its server, when the kernel holds none (after a restart). */
  get attachable(): IAttachable | null {
    return this._link?.attachable ?? null;
  }

  get pending(): ReadonlySet<Action> {
    return this._link?.pending ?? EMPTY;
  }

  get note(): INote | null {
    return this._link?.note ?? null;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  act(action: Action): void {
    this._link?.act(action);
  }

  retry(): void {
    this._link?.retry();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._link?.dispose();
    Signal.clearData(this);
    NotebookActions.executed.disconnect(this._onExecuted, this);
  }

  private _follow(): void {
    const panel = this._tracker.currentWidget;
    if (panel === this._panel) {
      return;
    }
    this._link?.dispose();
    this._panel = panel;
    this._link = panel ? new KernelLink(panel.sessionContext) : null;
    this._link?.changed.connect(() => this._changed.emit(), this);
    this._changed.emit();
  }

  private _onExecuted(_: unknown, args: Executed): void {
    if (this._panel && args.notebook === this._panel.content) {
      this._link?.cellExecuted(args.cell.model.sharedModel.getSource());
    }
  }

  private _changed = new Signal<this, void>(this);
  private _panel: NotebookPanel | null = null;
  private _link: KernelLink | null = null;
  private _disposed = false;
}

const EMPTY: ReadonlySet<Action> = new Set<Action>();

/** What `NotebookActions.executed` emits. */
type Executed = typeof NotebookActions.executed extends ISignal<any, infer A> ? A : never;
