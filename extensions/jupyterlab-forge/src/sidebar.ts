/**
 * ForgeSidebar: the session of the active notebook's kernel — up or not, its actors and their
 * health, policy / reward / loss versions, a tokens/s sparkline, and the Sync and Run/Pause buttons.
 *
 * The DOM is built once and updated in place on every model change (a few per second at most),
 * so a button is never replaced under the pointer between mousedown and click.
 */
import { Widget } from '@lumino/widgets';

import { forgeIcon } from './icon';
import { ForgeModel } from './model';
import { Action, IActor, ISession } from './protocol';
import { formatRate, sparklinePath } from './sparkline';

const SPARK_WIDTH = 180;
const SPARK_HEIGHT = 36;
const SVG = 'http://www.w3.org/2000/svg';

/** What the panel says when there is no session to show, by phase. */
const EMPTY_TEXT: Record<string, string> = {
  'no-notebook': 'Open a notebook to see its forge session.',
  'no-kernel': 'This notebook has no running kernel.',
  connecting: 'Waiting for the kernel…',
  restarting: 'The kernel is restarting…',
  unavailable: 'No forge session in this kernel.',
  open: 'No forge session in this kernel.'
};

export class ForgeSidebar extends Widget {
  constructor(private readonly _model: ForgeModel) {
    super();
    this.id = 'jp-forge-sidebar';
    this.addClass('jp-ForgeSidebar');
    this.title.icon = forgeIcon;
    this.title.caption = 'forge: the session of the active notebook';
    this.node.append(this._header(), this._empty(), this._body());
    _model.changed.connect(this._update, this);
    this._update();
  }

  dispose(): void {
    this._model.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _header(): HTMLElement {
    const header = el('div', 'jp-ForgeSidebar-header');
    const title = el('div', 'jp-ForgeSidebar-title', 'forge');
    header.append(title, this._notebook);
    return header;
  }

  private _empty(): HTMLElement {
    const box = this._emptyBox;
    const hint = el('div', 'jp-ForgeSidebar-hint');
    hint.append(
      el('div', '', 'Start one in a cell:'),
      el('pre', 'jp-ForgeSidebar-code', '%load_ext forge_nb\n%forge up')
    );
    const again = button('Check again', 'jp-ForgeSidebar-retry', () => this._model.retry());
    box.append(this._emptyText, this._attachBox, hint, again);
    this._attachBox.append(this._attachText, this._attach, this._attachNote);
    this._hint = hint;
    this._retry = again;
    return box;
  }

  private _body(): HTMLElement {
    const body = this._bodyBox;
    const versions = el('dl', 'jp-ForgeSidebar-versions');
    versions.append(
      el('dt', '', 'Policy'),
      this._policy,
      el('dt', '', 'Reward'),
      this._reward,
      el('dt', '', 'Loss'),
      this._loss,
      el('dt', '', 'Steps'),
      this._steps
    );
    const throughput = el('div', 'jp-ForgeSidebar-throughput');
    const spark = document.createElementNS(SVG, 'svg');
    spark.setAttribute('class', 'jp-ForgeSidebar-sparkline');
    // Stretched to the panel's width; the stroke keeps its width (CSS: non-scaling-stroke).
    spark.setAttribute('viewBox', `0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`);
    spark.setAttribute('preserveAspectRatio', 'none');
    spark.setAttribute('height', `${SPARK_HEIGHT}`);
    spark.append(this._sparkPath);
    throughput.append(this._rate, spark);
    const buttons = el('div', 'jp-ForgeSidebar-buttons');
    buttons.append(this._sync, this._run);
    body.append(
      this._status,
      section('Versions'),
      versions,
      section('Generated tokens/s'),
      throughput,
      section('Run'),
      this._runState,
      buttons,
      this._note,
      section('Actors'),
      this._actors
    );
    return body;
  }

  private _update(): void {
    const model = this._model;
    const session = model.session;
    this._notebook.textContent = model.panel?.title.label ?? '';
    this._emptyBox.hidden = session !== null;
    this._bodyBox.hidden = session === null;
    if (session === null) {
      const phase = model.phase;
      const found = model.attachable;
      this._emptyText.textContent = EMPTY_TEXT[phase];
      this._emptyBox.dataset.phase = phase;
      const nothing = (phase === 'unavailable' || phase === 'open') && found === null;
      this._hint.hidden = !nothing;
      this._retry.hidden = !nothing;
      this._attachBox.hidden = found === null;
      if (found !== null) {
        const run = found.run ? `, run ${found.run}` : '';
        this._attachText.textContent = `This notebook's session ${found.name} is still running (step ${found.steps}${run}).`;
        const busy = model.pending.has('attach');
        setButton(this._attach, busy ? 'Attaching…' : 'Attach', busy);
        const note = model.note;
        this._attachNote.textContent = note?.text ?? '';
        this._attachNote.classList.toggle('jp-mod-error', note !== null && !note.ok);
      }
      return;
    }
    this._show(session);
  }

  private _show(s: ISession): void {
    const where = s.slurm_job ? `Slurm job ${s.slurm_job}` : `${s.mesh} mesh`;
    const others = s.clients > 1 ? ` · ${s.clients} clients` : '';
    this._status.textContent = `Session up · ${s.name} · ${where} · ${s.engine} engine${others}`;
    this._status.title = `session ${s.name}: it runs in a server of its own and outlives this kernel`;
    const { trainer, generator, staleness } = s.policy;
    this._policy.textContent =
      staleness > 0 ? `v${generator} serving · v${trainer} trained` : `v${generator} serving`;
    this._policy.dataset.generator = `${generator}`;
    this._policy.dataset.trainer = `${trainer}`;
    this._reward.textContent = `v${s.reward_version}`;
    this._loss.textContent = `v${s.loss_version}`;
    this._steps.textContent = `${s.steps} trained · ${s.samples} samples`;
    this._rate.textContent = `${formatRate(s.tokens_per_s.last)} tok/s`;
    this._sparkPath.setAttribute(
      'd',
      sparklinePath(s.tokens_per_s.history, SPARK_WIDTH, SPARK_HEIGHT)
    );

    const run = s.run;
    const state = run?.state ?? 'idle';
    this._runState.textContent =
      run === null
        ? 'idle'
        : `${state} · ${run.steps_done} step${run.steps_done === 1 ? '' : 's'}` +
          (run.error ? ` · ${run.error}` : '');
    this._runState.dataset.state = state;
    const next: Action = state === 'running' ? 'pause' : state === 'paused' ? 'resume' : 'run';
    this._runAction = next;
    const pending = this._model.pending;
    setButton(this._sync, pending.has('sync') ? 'Syncing…' : 'Sync', pending.has('sync'));
    const runBusy = pending.has('run') || pending.has('pause') || pending.has('resume');
    setButton(this._run, LABEL[next], runBusy);

    const note = this._model.note;
    this._note.textContent = note?.text ?? '';
    this._note.classList.toggle('jp-mod-error', note !== null && !note.ok);

    this._actors.replaceChildren(...s.actors.map(actorRow));
  }

  private _notebook = el('div', 'jp-ForgeSidebar-notebook');
  private _emptyBox = el('div', 'jp-ForgeSidebar-empty');
  private _emptyText = el('div', 'jp-ForgeSidebar-emptyText');
  private _attachBox = el('div', 'jp-ForgeSidebar-attachBox');
  private _attachText = el('div', 'jp-ForgeSidebar-attachText');
  private _attach = button('Attach', 'jp-ForgeSidebar-attach', () => this._model.act('attach'));
  private _attachNote = el('div', 'jp-ForgeSidebar-attachNote');
  private _hint!: HTMLElement;
  private _retry!: HTMLElement;
  private _bodyBox = el('div', 'jp-ForgeSidebar-body');
  private _status = el('div', 'jp-ForgeSidebar-status');
  private _policy = el('dd', 'jp-ForgeSidebar-policy');
  private _reward = el('dd', 'jp-ForgeSidebar-reward');
  private _loss = el('dd', 'jp-ForgeSidebar-loss');
  private _steps = el('dd', 'jp-ForgeSidebar-steps');
  private _rate = el('div', 'jp-ForgeSidebar-rate');
  private _sparkPath = document.createElementNS(SVG, 'path');
  private _runState = el('div', 'jp-ForgeSidebar-runState');
  private _runAction: Action = 'run';
  private _sync = button('Sync', 'jp-ForgeSidebar-sync', () => this._model.act('sync'));
  private _run = button('Run', 'jp-ForgeSidebar-run', () => this._model.act(this._runAction));
  private _note = el('div', 'jp-ForgeSidebar-note');
  private _actors = el('table', 'jp-ForgeSidebar-actors');
}

const LABEL: Record<Action, string> = {
  sync: 'Sync',
  run: 'Run',
  pause: 'Pause',
  resume: 'Resume',
  attach: 'Attach'
};

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function section(title: string): HTMLElement {
  return el('div', 'jp-ForgeSidebar-section', title);
}

function button(label: string, className: string, onClick: () => void): HTMLButtonElement {
  const node = el('button', `jp-ForgeSidebar-button ${className}`, label);
  node.type = 'button';
  node.addEventListener('click', () => onClick());
  return node;
}

function setButton(node: HTMLButtonElement, label: string, busy: boolean): void {
  if (node.textContent !== label) {
    node.textContent = label;
  }
  node.disabled = busy;
}

function actorRow(actor: IActor): HTMLTableRowElement {
  const row = el('tr', `jp-ForgeSidebar-actor jp-mod-${actor.health}`);
  const dot = el('span', 'jp-ForgeSidebar-dot');
  const health = el('td', 'jp-ForgeSidebar-health');
  health.append(dot, document.createTextNode(actor.health));
  const pids = actor.pids.length === 1 ? `pid ${actor.pids[0]}` : `pids ${actor.pids.join(', ')}`;
  const where = el('td', 'jp-ForgeSidebar-devices', devicesText(actor.devices));
  where.title = actor.hosts.map((h, i) => `proc ${i}: ${h}`).join('\n');
  const pidsCell = el('td', 'jp-ForgeSidebar-pids', pids);
  pidsCell.title = pids;
  row.append(el('td', 'jp-ForgeSidebar-role', actor.role), pidsCell, where, health);
  return row;
}

/** "cpu", "gpu 0", or one GPU list per proc: "gpu 0 · 1 · 2,3". */
export function devicesText(devices: number[][]): string {
  if (devices.every(d => d.length === 0)) {
    return 'cpu';
  }
  return 'gpu ' + devices.map(d => (d.length ? d.join(',') : 'cpu')).join(' · ');
}
