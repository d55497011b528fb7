/** ForgeStatus: the status-bar item — the session, policy version served and generated tokens/s. */
import { Widget } from '@lumino/widgets';

import { ForgeModel } from './model';
import { formatRate } from './sparkline';

export class ForgeStatus extends Widget {
  constructor(
    private readonly _model: ForgeModel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-ForgeStatus');
    this.node.title = 'forge: open the sidebar';
    this.node.addEventListener('click', () => onClick());
    _model.changed.connect(this._update, this);
    this._update();
  }

  dispose(): void {
    this._model.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _update(): void {
    const s = this._model.session;
    if (s === null) {
      const found = this._model.attachable;
      this.node.textContent = found ? `forge · ${found.name} running · not attached` : '';
      return;
    }
    const { generator, staleness } = s.policy;
    const behind = staleness > 0 ? ` (+${staleness})` : '';
    this.node.textContent = `forge · ${s.name} · policy v${generator}${behind} · ${formatRate(s.tokens_per_s.last)} tok/s`;
    this.node.dataset.generator = `${generator}`;
  }
}
