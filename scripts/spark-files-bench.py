"""Spark's side of the `files` workload: the Parquet files `weir bench --workload files
--input-dir DIR` wrote, read by Spark's file source with maxFilesPerTrigger, GROUP BY k (count,
sum) in update mode into the noop sink; the same session settings as the reference Spark bench
(local[2], 2 shuffle partitions, RocksDB state). Prints one JSON object: the median rows/s per
measured batch (numInputRows / triggerExecution), as weir's bench reports it.

usage: spark-files-bench.py DIR FILES_PER_BATCH BATCHES WARMUP CHECKPOINT"""
import json, os, statistics, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "shared", "reference", "spark-bench"))
from common import session  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

src, per_batch, batches, warmup, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
spark = session("files-bench")
df = (spark.readStream.schema("id BIGINT, k BIGINT, v DOUBLE")
      .option("maxFilesPerTrigger", per_batch).parquet(src)
      .groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total")))
q = (df.writeStream.format("noop").outputMode("update")
     .option("checkpointLocation", ckpt).start())
q.processAllAvailable()
progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
q.stop()
measured = progress[warmup:warmup + batches]
rates = [p["numInputRows"] / (max(p["durationMs"]["triggerExecution"], 1) / 1000) for p in measured]
print(json.dumps({"batches": len(measured), "rowsPerSecMedian": statistics.median(rates)}))
