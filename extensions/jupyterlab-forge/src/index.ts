/**
 * jupyterlab-forge: a sidebar and a status-bar item for the forge_nb session of the active
 * notebook's kernel. It talks to the kernel only over the kernel channel (see `protocol.ts` and
 * `forge_nb/notebook/sidebar.py`): no server endpoint.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { ForgeModel } from './model';
import { ForgeSidebar } from './sidebar';
import { ForgeStatus } from './statusbar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-forge:plugin',
  description:
    'The forge_nb session of the active notebook: mesh, versions, throughput, Sync and Run/Pause.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILayoutRestorer, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null
  ) => {
    const model = new ForgeModel(tracker);
    const sidebar = new ForgeSidebar(model);
    app.shell.add(sidebar, 'right', { rank: 900 });
    restorer?.add(sidebar, sidebar.id);
    if (statusBar) {
      const item = new ForgeStatus(model, () => app.shell.activateById(sidebar.id));
      statusBar.registerStatusItem('jupyterlab-forge:status', {
        item,
        align: 'left',
        rank: 50,
        isActive: () => model.session !== null,
        activeStateChanged: model.changed
      });
    }
  }
};

export default plugin;
