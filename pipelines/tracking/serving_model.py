"""The registered model's code: an MLflow ``PythonModel`` that runs the deploy graph with onnxruntime.

Logged as *models from code* (``mlflow.pyfunc.log_model(python_model=<this file>)``): MLflow copies this file
into the model and runs it at load time, so nothing is unpickled. It depends on numpy, pandas, the plain
onnxruntime (``InferenceSession`` only: never the training build) and MLflow, never on the ``pipelines`` package,
so the model loads wherever its requirements are installed.

Input: a pandas DataFrame (or what ``pandas.DataFrame`` takes: a dict of columns, a list of records) whose columns
are the data's feature names, in any order, extra columns ignored. The model checks its input itself (its
signature declares no input schema: MLflow's would refuse an int64 column for a double one): every feature
column must hold numbers (any integer or float dtype, or numeric strings as a CSV without a schema gives them),
finite and within float32's range, the type the graph computes in. A missing column, a missing cell (``null``,
NaN), a non-number or a non-finite or out-of-range value raises ``MlflowException`` (``INVALID_PARAMETER_VALUE``,
which ``mlflow models serve`` answers with HTTP 400) naming the column and the row (0-based position).

A model trained on a table's raw columns (``preprocess=auto``; the model config's ``columns`` gives each column's
kind) takes them as a CSV has them: numbers (gaps allowed: the graph imputes them), booleans, text (any value;
a gap is the category the training data's gaps were, an unknown value is ignored by the one-hot encoding) and
dates (ISO text or datetimes; gaps allowed). A cell that is not of its column's kind raises the same
``MlflowException`` naming the column and the row.

A graph taking arrays (``model=onnx``: images ``(N, 1, 8, 8)``, int64 tokens ``(N, T)``) is served the same way,
one row per sample: the columns are the values of a row flattened (``pixel_0_0`` ... ``pixel_7_7``, ``token_0`` ...),
reshaped to the graph's input shape; an integer input (token ids) takes integral numbers only. A numpy array of
the graph's own shape (``mlflow.pyfunc``) is taken too.

Served by ``mlflow models serve`` (its FastAPI scoring server, in whose process this file is loaded), the model
also bounds the requests: a body over :data:`MAX_BODY_BYTES` (32 MiB; the environment variable
``ORTFLOW_SERVING_MAX_BODY_BYTES`` of the serving command sets another) is answered with HTTP 413 before more than
that is read, and JSON nested deeper than Python's parser takes (which the server answered with a 500) with 400
naming the problem. Elsewhere (``mlflow.pyfunc.load_model``) nothing changes.

Output: ``prediction`` (a one-column DataFrame) for a regressor; for a classifier the labels (a Series named
``label``, the classes as the data had them: what ``mlflow.models.evaluate(..., model_type="classifier")`` takes),
or, with the parameter ``output="probabilities"``, a DataFrame with ``label`` and one column
``probability_<class>`` per class, in the order of the model config's ``classes``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

#: the key of the deploy graph in the logged model's artifacts
GRAPH = "deploy_model"
#: the inference parameter choosing a classifier's output, and its values (the first is the default)
OUTPUT_PARAM = "output"
OUTPUTS = ("label", "probabilities")
PROBABILITY_PREFIX = "probability_"
#: the largest magnitude the graph's float32 arithmetic holds
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: how many bad cells an error names
SHOWN = 5
#: the largest request body ``mlflow models serve`` reads for this model (bytes), unless the environment variable
#: :data:`MAX_BODY_ENV` says otherwise; a larger one gets HTTP 413
MAX_BODY_BYTES = 32 * 2**20
MAX_BODY_ENV = "ORTFLOW_SERVING_MAX_BODY_BYTES"


def probability_columns(classes) -> list[str]:
    """The output columns of the class probabilities, in the order of ``classes``."""
    return [f"{PROBABILITY_PREFIX}{c}" for c in classes]


class InvalidInput(MlflowException):
    """A bad request's error, whose message stays what the model wrote: MLflow's scoring server rewrites the
    message of an ``MlflowException`` raised by ``predict`` into ``Failed to predict data '<the request's frame>'.
    Error: ...``, an 11-line DataFrame repr before the one line that says what is wrong."""

    @property
    def message(self) -> str:
        return self.__dict__.get("_message", "")

    @message.setter
    def message(self, value: str) -> None:
        self.__dict__.setdefault("_message", value)  # the first (the model's own); the server's rewrite is dropped


def invalid(message: str) -> MlflowException:
    """The error a bad request gets: ``mlflow models serve`` answers it with HTTP 400 and this message."""
    return InvalidInput(message, error_code=INVALID_PARAMETER_VALUE)


def feature_matrix(model_input, features: list[str]) -> np.ndarray:
    """The feature columns of ``model_input`` as a float32 matrix in the graph's order; :func:`invalid` naming
    the columns and rows when a column is missing or a cell is not a finite number within float32's range."""
    frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
    by_name = {str(c): c for c in frame.columns}  # the caller's frame is read, never changed
    missing = [f for f in features if f not in by_name]
    if missing:
        raise invalid(f"the input lacks the feature columns {missing}; the model takes the columns {features}")
    columns, problems = [], []
    for name in features:
        raw = frame[by_name[name]]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        absent = pd.isna(raw).to_numpy()
        bad = np.flatnonzero(~np.isfinite(values) | (np.abs(values) > FLOAT32_MAX))
        for row in bad:
            if absent[row]:
                what = "a missing value (null/NaN)"
            elif np.isnan(values[row]):
                what = f"{_cell(raw.iloc[row])}, not a number"
            elif np.isfinite(values[row]):
                what = f"{values[row]:g}, beyond float32's range (±3.4e38) the model computes in"
            else:
                what = f"{values[row]:g}, not a finite number"
            problems.append(f"column {name!r} row {row}: {what}")
        columns.append(values)
    if problems:
        shown = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        raise invalid(f"{len(problems)} input cells are not finite numbers ({shown}); the model takes a finite "
                      "number in every feature column")
    return np.stack(columns, axis=1).astype(np.float32) if columns else np.zeros((len(frame), 0), np.float32)


_BOOLEANS = {True: 1.0, False: 0.0, "True": 1.0, "False": 0.0, "true": 1.0, "false": 0.0, 1: 1.0, 0: 0.0}


def table_feeds(model_input, columns: dict[str, str], inputs, text_missing: str) -> dict[str, np.ndarray]:
    """The feeds of a table's graph (one ``(n, 1)`` input per column) from the raw columns of ``model_input``,
    converted by kind as the training data was: numbers and booleans float32 (NaN for a gap), text strings (a gap
    becomes ``text_missing``), dates int64 days since 1970-01-01 (a gap the smallest int64). :func:`invalid`
    naming the column and the row for a missing column or a cell of the wrong kind."""
    frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
    by_name = {str(c): c for c in frame.columns}
    missing = [c for c in columns if c not in by_name]
    if missing:
        raise invalid(f"the input lacks the columns {missing}; the model takes the columns {list(columns)}")
    feeds, problems = {}, []
    for spec in inputs:
        name, kind = spec.name, columns[spec.name]
        raw = frame[by_name[name]]
        absent = pd.isna(raw).to_numpy()
        if kind == "bool":  # True/False, their JSON and CSV spellings, 1 and 0: nothing else
            values = raw.map(lambda v: _BOOLEANS.get(v, np.inf) if _hashable(v) else np.inf, na_action="ignore")
            values = values.to_numpy(np.float64, na_value=np.nan)
            bad = np.flatnonzero(np.isinf(values))
            problems += [f"column {name!r} row {r}: {_cell(raw.iloc[r])}, not a boolean" for r in bad]
            feeds[name] = np.where(np.isinf(values), np.nan, values).astype(np.float32).reshape(-1, 1)
        elif kind == "number":
            # a boolean is no number here (pandas would read True as 1): the column held numbers in training
            booleans = raw.map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(bool)
            values = pd.to_numeric(raw.where(~booleans), errors="coerce").to_numpy(np.float64, na_value=np.nan)
            bad = np.flatnonzero((np.isnan(values) & ~absent) | np.isinf(values) | (np.abs(values) > FLOAT32_MAX))
            problems += [f"column {name!r} row {r}: {_cell(raw.iloc[r])}, "
                         f"{'a boolean, not a number' if booleans[r] else 'not a finite number'}" for r in bad]
            feeds[name] = values.astype(np.float32).reshape(-1, 1)
        elif kind == "date":
            values = _dates(raw) if raw.dtype.kind != "M" else raw
            if getattr(values.dt, "tz", None) is not None:
                values = values.dt.tz_convert(None)
            bad = np.flatnonzero(values.isna().to_numpy() & ~absent)
            problems += [f"column {name!r} row {r}: {_cell(raw.iloc[r])}, not a date" for r in bad]
            ambiguous = [r for r, v in enumerate(raw.tolist()) if isinstance(v, str) and _AMBIGUOUS_DATE.match(v)]
            problems += [f"column {name!r} row {r}: {raw.iloc[r]!r}, an ambiguous date (day or month first?): send "
                         "it as ISO text, YYYY-MM-DD" for r in ambiguous]
            feeds[name] = _days(values.to_numpy("datetime64[ns]")).reshape(-1, 1)
        else:
            text = [text_missing if gap else _text(v) for v, gap in zip(raw.tolist(), absent)]
            feeds[name] = np.array(text, dtype=object).reshape(-1, 1)
    if problems:
        shown = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        raise invalid(f"{len(problems)} input cells do not fit their column ({shown})")
    return feeds


def _days(values: np.ndarray) -> np.ndarray:
    """int64 days since 1970-01-01 of datetime64[ns] values, floored; NaT the smallest int64 (what
    ``ortflow.convert.tables.to_days`` gives the training data; this file imports no ortflow). Integer division:
    numpy's own ``[ns] -> [D]`` cast gave 1677-09-22 as +106751 (numpy 2.4)."""
    days = np.floor_divide(values.astype(np.int64), 86_400 * 10**9)
    return np.where(np.isnat(values), np.iinfo(np.int64).min, days).astype(np.int64)


def _cell(value) -> str:
    """A cell as an error shows it: numpy scalars as the Python values a request holds (``2``, not ``np.int64(2)``)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


#: a date whose first two numbers may both be a month (05/04/2022, 5.4.22): read one way, it is another date
_AMBIGUOUS_DATE = re.compile(r"^\s*(0?[1-9]|1[0-2])[/.-](0?[1-9]|1[0-2])[/.-]\d{2,4}\b")


def _dates(raw):
    """Each cell parsed on its own (``format="mixed"``, pandas >= 2; pandas 1 infers each cell's format itself);
    NaT where a cell is not a date."""
    try:
        return pd.to_datetime(raw, errors="coerce", format="mixed")
    except (TypeError, ValueError):
        return pd.to_datetime(raw, errors="coerce")


def _text(value) -> str:
    """A text cell as training saw it (pipelines.data.tables): an integral float without its ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def check_finite_outputs(values: np.ndarray) -> None:
    """:func:`invalid` naming the rows whose prediction is not finite (inputs too large for the model's scale)."""
    values = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if len(bad):
        raise invalid(f"the model predicts non-finite values for rows {bad[:SHOWN].tolist()}"
                      f"{' ...' if len(bad) > SHOWN else ''} ({len(bad)} rows): their inputs are too large for the "
                      "scale the model was trained at")


def shaped(matrix: np.ndarray, spec, features: list[str]) -> np.ndarray:
    """The rows of ``matrix`` (one flattened sample each) as the graph's input ``spec`` takes them: reshaped to its
    shape when it has more than one axis after the batch (images), int64 for an integer input (token ids; a value
    that is not a whole number raises :func:`invalid` naming its column and row)."""
    shape = list(spec.shape[1:])
    if len(shape) > 1 and all(isinstance(d, int) for d in shape):
        matrix = matrix.reshape(len(matrix), *shape)
    if spec.type == "tensor(int64)":
        flat = matrix.reshape(len(matrix), -1)
        bad = np.argwhere(flat != np.round(flat))
        if len(bad):
            row, column = bad[0]
            raise invalid(f"{len(bad)} input cells are not whole numbers (first: column {features[int(column)]!r} "
                          f"row {int(row)}: {flat[row, column]:g}); the model takes integer ids")
        matrix = matrix.astype(np.int64)
    return matrix


class DeployedOnnxModel(PythonModel):
    """The deploy graph (raw features in, target units or class labels out) behind MLflow's pyfunc interface.

    ``model_config``: ``features`` (the column names, in the graph's order), ``task`` (``regression`` or
    ``classification``) and, for a classifier, ``classes``.
    """

    def load_context(self, context) -> None:
        import onnxruntime

        config = context.model_config
        self.features = [str(f) for f in config["features"]]
        self.task = str(config["task"])
        self.classes = list(config.get("classes") or [])
        self.columns = dict(config.get("columns") or {})  # a table's raw columns and their kinds
        self.text_missing = str(config.get("text_missing") or "")
        self.session = onnxruntime.InferenceSession(context.artifacts[GRAPH], providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.outputs = [o.name for o in self.session.get_outputs()]

    def _feeds(self, model_input) -> dict:
        if self.columns:
            return table_feeds(model_input, self.columns, self.session.get_inputs(), self.text_missing)
        if isinstance(model_input, np.ndarray) and model_input.ndim >= 2:  # rows of the graph's own shape
            model_input = pd.DataFrame(model_input.reshape(len(model_input), -1), columns=self.features)
        return {self.input_name: shaped(feature_matrix(model_input, self.features), self.session.get_inputs()[0],
                                        self.features)}

    # pd.DataFrame: a type hint MLflow infers no signature from (the one given stays), and the load-time warning
    # asking for type hints goes; a dict of columns, records or an array are taken too (see the module's docstring)
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame | pd.Series:
        feeds = self._feeds(model_input)
        X = next(iter(feeds.values()))
        output = (params or {}).get(OUTPUT_PARAM) or OUTPUTS[0]
        if self.task == "classification" and output not in OUTPUTS:
            raise invalid(f"params {OUTPUT_PARAM}={output!r}: one of {list(OUTPUTS)}")
        if len(X) == 0:  # no rows: no answer to compute (the graph's reshapes refuse an empty batch)
            return self._empty(output)
        if self.task == "classification":
            label, proba = self.session.run(["output_label", "output_probability"], feeds)
            proba = np.asarray(proba, dtype=np.float64).reshape(len(X), -1)
            check_finite_outputs(proba)
            labels = pd.Series(np.asarray(label).ravel(), name="label")
            if output == "label":
                return labels
            return pd.concat([labels, pd.DataFrame(proba, columns=probability_columns(self.classes))], axis=1)
        prediction = np.asarray(self.session.run([self.outputs[0]], feeds)[0], dtype=np.float64)
        prediction = prediction.reshape(len(X), -1)[:, 0]
        check_finite_outputs(prediction)
        return pd.DataFrame({"prediction": prediction})

    def _empty(self, output: str):
        """The answer to a request without rows: the columns of an answer, no row."""
        if self.task != "classification":
            return pd.DataFrame({"prediction": np.zeros(0)})
        labels = pd.Series(np.array(self.classes[:0]), name="label")
        if output == "label":
            return labels
        return pd.concat([labels, pd.DataFrame(np.zeros((0, len(self.classes))),
                                               columns=probability_columns(self.classes))], axis=1)


def bound_scoring_server() -> None:
    """In the process of ``mlflow models serve`` (MLflow's FastAPI scoring server, which reads and parses a request
    before the model sees it): a request body over the limit (:data:`MAX_BODY_BYTES`) is refused with 413 while it
    is read, and JSON too deeply nested for Python's parser gets 400 instead of 500. Does nothing elsewhere."""
    import json
    import os

    try:
        from mlflow.pyfunc import scoring_server
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
    except ImportError:  # not a serving installation
        return
    if scoring_server._SERVER_MODEL_PATH not in os.environ or getattr(Request.body, "ortflow_limit", None):
        return
    limit = int(os.environ.get(MAX_BODY_ENV) or MAX_BODY_BYTES)
    too_large = (f"the request body is larger than {limit} bytes, the limit of this model's server (set by "
                 f"{MAX_BODY_ENV} when the server starts): send the rows in several requests")

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            declared = self.headers.get("content-length", "")
            over = declared.isdigit() and int(declared) > limit
            chunks, size = [], 0
            async for chunk in self.stream():  # past the limit, read on without keeping: the client gets its 413
                size += len(chunk)
                over = over or size > limit
                if over:
                    chunks.clear()
                else:
                    chunks.append(chunk)
            if over:
                raise HTTPException(413, too_large)
            self._body = b"".join(chunks)
        return self._body

    body.ortflow_limit = limit
    Request.body = body
    parse = scoring_server.invocations

    def invocations(data, content_type, model, input_schema):
        try:
            return parse(data, content_type, model, input_schema)
        except RecursionError:
            message = ("the request's JSON is nested too deeply to be parsed: send a dataframe_split, "
                       "dataframe_records, instances or inputs object of rows of values")
            return scoring_server.InvocationsResponse(
                response=json.dumps({"error_code": "BAD_REQUEST", "message": message}), status=400,
                mimetype="application/json")

    scoring_server.invocations = invocations


bound_scoring_server()
set_model(DeployedOnnxModel())
