"""Runs a Nexmark query of queries/nexmark in Spark Structured Streaming over the Parquet files
`weir bench --workload nexmark-qN --input-dir DIR` wrote (DIR/bid, DIR/auction, DIR/person, one
file per batch), with Spark's file source (maxFilesPerTrigger 1, trigger availableNow) into the
noop sink, and prints one JSON line: events/s from the query's start to its end, as weir's.

    .venv-spark/bin/python scripts/nexmark-spark.py --query q1 --dir /tmp/nx [--cores 1]

The query text is the file's, turned into Spark SQL: STREAM dropped, the WATERMARK clauses
become withWatermark on the views (4 seconds, as the files say), regexp_match(...)[n] becomes
regexp_extract, to_char's formats become date_format's. A query Spark cannot run prints its
error class instead of a rate.
"""
import argparse, json, os, re, shutil, sys, tempfile, time

from pyspark.sql import SparkSession

ROCKS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def spark_sql(text):
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("--")]
    sql = "\n".join(lines).strip().rstrip(";")
    sql = re.sub(r"(?i)\s+WATERMARK\s+\w+\s+DELAY\s+OF\s+INTERVAL\s+\d+\s+\w+", "", sql)
    sql = re.sub(r"(?i)\bSTREAM\s+", "", sql)
    sql = re.sub(r"regexp_match\(([^,]+),\s*('[^']*')\)\[(\d+)\]", r"regexp_extract(\1, \2, \3)", sql)
    fmt = {"'%Y-%m-%d'": "'yyyy-MM-dd'", "'%H:%M'": "'HH:mm'"}
    sql = re.sub(r"to_char\(([^,]+),\s*('[^']*')\)", lambda m: f"date_format({m.group(1)}, {fmt.get(m.group(2), m.group(2))})", sql)
    return sql


def directive(text, key):
    for l in text.splitlines():
        l = l.strip()
        if l.startswith("-- weir:") and l[8:].strip().startswith(key):
            return l[8:].strip()[len(key):].lstrip("=:").strip()
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--query", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--cores", type=int, default=1)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    name = args.query.lower().removeprefix("nexmark-")
    text = open(os.path.join(root, "queries", "nexmark", name + ".sql")).read()
    manifest = json.load(open(os.path.join(args.dir, "nexmark.json")))
    out = {"query": name, "engine": "spark", "events": manifest["events"], "cores": args.cores}
    if directive(text, "unsupported"):
        out["error"] = "weir cannot run it either: " + directive(text, "unsupported")
        print(json.dumps(out))
        return
    spark = (SparkSession.builder.master(f"local[{args.cores}]").appName("nexmark")
             .config("spark.sql.shuffle.partitions", str(args.cores))
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.adaptive.enabled", "false")
             .config("spark.driver.memory", "4g")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKS)
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    watermarked = "WATERMARK" in text.upper()
    mode = directive(text, "outputMode") or "append"
    ck = tempfile.mkdtemp(prefix="nexmark-spark-ck-")
    try:
        for table in ["bid", "auction", "person"]:
            path = os.path.join(args.dir, table)
            schema = spark.read.parquet(path).schema
            df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(path)
            # The files' times have no time zone (TIMESTAMP_NTZ); Spark's watermarks and windows
            # want TIMESTAMP: the same instants, read in UTC.
            for f in schema.fields:
                if f.dataType.typeName() == "timestamp_ntz":
                    df = df.withColumn(f.name, df[f.name].cast("timestamp"))
            if watermarked:
                df = df.withWatermark("date_time", "4 seconds")
            df.createOrReplaceTempView(table)
        spark.range(10000).selectExpr("id AS key", "CAST(id AS STRING) AS value").createOrReplaceTempView("side_input")
        started = time.time()
        q = (spark.sql(spark_sql(text)).writeStream.format("noop").outputMode(mode)
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination()
        seconds = time.time() - started
        progress = q.recentProgress
        out.update({
            "seconds": seconds,
            "eventsPerSec": manifest["events"] / seconds,
            "batches": len(progress),
            "inputRows": sum(p["numInputRows"] for p in progress),
        })
    except Exception as e:  # Spark's AnalysisException and friends: report the class.
        m = re.search(r"\[([A-Z_.]+)\]", str(e))
        out["error"] = (m.group(1) if m else type(e).__name__) + ": " + str(e).splitlines()[0][:300]
    finally:
        shutil.rmtree(ck, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
