import { LabIcon } from '@jupyterlab/ui-components';

/** An anvil, for the sidebar's tab. */
const SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <path class="jp-icon3" fill="#616161"
    d="M2 5h14v1.5c0 1.9 1.6 3.5 3.5 3.5H22v1.5c-2.8 0-5 1.2-6 3.2V16h1.5v3h-11v-3H8v-1.3C7.3 12.4 5 11 2 11z"/>
</svg>`;

export const forgeIcon = new LabIcon({ name: 'jupyterlab-forge:anvil', svgstr: SVG });
