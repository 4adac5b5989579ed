// Log a trained state to a run of the team's MLflow tracking server (`make server`, i.e. `python -m
// pipelines.server`: PostgreSQL + `mlflow server` with proxied artifacts) through MLflow's REST API, for
// `python -m pipelines.import_states --run RUN_ID` (or `--experiment NAME --tag key=value`) to register it as a new
// version. The server must allow the page's origin (`--cors-allowed-origins`: docs/TRAINING_OUTSIDE_PYTHON.md).
//
// The run: created in the experiment (made when missing) with the tags below, the state uploaded through the
// proxied artifact store (PUT /api/2.0/mlflow-artifacts/artifacts/<the run's artifact path>/state/trained.state),
// each epoch's loss logged, then ended FINISHED; a failure after the run was made ends it FAILED with the reason in
// its tag `ortflow.failure`.

/** Where the state is in the run (the tag `ortflow.state_artifact` says it too; import_states reads it). */
export const STATE_ARTIFACT = 'state/trained.state';

async function call(server, method, path, body) {
  const init = {method};
  if (body !== undefined) {
    init.headers = {'Content-Type': 'application/json'};
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`${server}/api/2.0/mlflow/${path}`, init);
  } catch (err) {  // the browser hides why: most often CORS (the page's origin not allowed) or no server
    throw new Error(`MLflow ${method} ${server}/api/2.0/mlflow/${path}: ${err.message} (is the server up, and ` +
                    `does its --cors-allowed-origins name ${location.origin}?)`);
  }
  const text = await response.text();
  const answer = text ? JSON.parse(text) : {};
  if (!response.ok) {
    const error = new Error(`MLflow ${method} ${path}: HTTP ${response.status} ${answer.error_code ?? ''} ` +
                            `${answer.message ?? text.slice(0, 300)}`);
    error.code = answer.error_code;
    throw error;
  }
  return answer;
}

async function experimentId(server, name) {
  const query = `experiments/get-by-name?experiment_name=${encodeURIComponent(name)}`;
  try {
    return (await call(server, 'GET', query)).experiment.experiment_id;
  } catch (err) {
    if (err.code !== 'RESOURCE_DOES_NOT_EXIST') throw err;
  }
  try {
    return (await call(server, 'POST', 'experiments/create', {name})).experiment_id;
  } catch (err) {  // another page made it meanwhile
    if (err.code !== 'RESOURCE_ALREADY_EXISTS') throw err;
    return (await call(server, 'GET', query)).experiment.experiment_id;
  }
}

/** The URL the proxied artifact store takes `artifact` of a run whose artifact_uri is `uri` at. */
function artifactUrl(server, uri, artifact) {
  const match = /^mlflow-artifacts:(?:\/\/[^/]*)?\/(.*)$/.exec(uri);
  if (!match) {
    throw new Error(`the run's artifact_uri ${uri} is not served by the tracking server: start it with ` +
                    '--serve-artifacts (pipelines.server does) and log to an experiment made since');
  }
  const path = `${match[1].replace(/\/$/, '')}/${artifact}`.split('/').map(encodeURIComponent).join('/');
  return `${server}/api/2.0/mlflow-artifacts/artifacts/${path}`;
}

/**
 * Log `state` (the bytes of trainer.exportState()) to a new run of `experiment` on the tracking server `server`
 * (its URL). `packageId`: trainer.packageId; `source`: {model, version}, the registered version whose training
 * package was trained (tags ortflow.source_model/ortflow.source_version); `tags`: more tags ({key: value}, e.g. to
 * select the runs later); `epochs`: each epoch's logs ({epoch, loss}) logged as the metric `loss`.
 * Returns {runId, experimentId, artifact}.
 */
export async function logStateToMlflow(server, {experiment, state, packageId, source = {}, tags = {}, epochs = [],
                                                runName}) {
  server = String(server).replace(/\/+$/, '');
  const id = await experimentId(server, experiment);
  const allTags = {'ortflow.package_id': packageId, 'ortflow.state_artifact': STATE_ARTIFACT,
                   'mlflow.source.name': location.href.split('?')[0], 'mlflow.source.type': 'LOCAL', ...tags};
  if (source.model) allTags['ortflow.source_model'] = String(source.model);
  if (source.version) allTags['ortflow.source_version'] = String(source.version);
  const {run} = await call(server, 'POST', 'runs/create', {
    experiment_id: id, start_time: Date.now(), run_name: runName,
    tags: Object.entries(allTags).map(([key, value]) => ({key, value: String(value)}))});
  const runId = run.info.run_id;
  try {
    const url = artifactUrl(server, run.info.artifact_uri, STATE_ARTIFACT);
    const put = await fetch(url, {method: 'PUT', headers: {'Content-Type': 'application/octet-stream'},
                                  body: state});
    if (!put.ok) throw new Error(`PUT ${url}: HTTP ${put.status} ${(await put.text()).slice(0, 300)}`);
    const timestamp = Date.now();
    const metrics = epochs.map((e) => ({key: 'loss', value: e.loss, timestamp, step: e.epoch}));
    for (let i = 0; i < metrics.length; i += 1000) {  // log-batch takes 1000 metrics at most
      await call(server, 'POST', 'runs/log-batch', {run_id: runId, metrics: metrics.slice(i, i + 1000)});
    }
    await call(server, 'POST', 'runs/update', {run_id: runId, status: 'FINISHED', end_time: Date.now()});
  } catch (err) {
    await call(server, 'POST', 'runs/set-tag', {run_id: runId, key: 'ortflow.failure',
                                                value: String(err.message).slice(0, 4900)}).catch(() => {});
    await call(server, 'POST', 'runs/update', {run_id: runId, status: 'FAILED', end_time: Date.now()})
      .catch(() => {});
    throw err;
  }
  return {runId, experimentId: id, artifact: STATE_ARTIFACT};
}

/** The run options the page's query names: tracking (the server's URL), experiment, sourceModel, sourceVersion and
 * tag=key=value (repeatable); null without `tracking`. */
export function trackingOptions(params) {
  if (!params.has('tracking')) return null;
  const tags = {};
  for (const word of params.getAll('tag')) {
    const at = word.indexOf('=');
    if (at <= 0) throw new Error(`tag=${word}: write tag=key=value`);
    tags[word.slice(0, at)] = word.slice(at + 1);
  }
  return {server: params.get('tracking'), experiment: params.get('experiment') || 'ortflow-browser-states', tags,
          source: {model: params.get('sourceModel'), version: params.get('sourceVersion')}};
}
