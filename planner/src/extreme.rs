//! `min` and `max` over a changelog (see [`crate::changelog`]): an aggregate of `(x, weight)`
//! rows that keeps how many times each value of `x` is in the group, so a retracted row
//! (weight -1) takes its value back and the extreme falls to the next value still there, as
//! Flink's `MaxWithRetractAggFunction` keeps a map of values to counts.
//!
//! State per group: `values` (a list of the distinct values present) and `counts` (how many
//! times each is), so a group costs its distinct values, not its rows.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility,
};

/// `weir_max_retracting(x, weight)` or `weir_min_retracting(x, weight)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RetractingExtreme {
    max: bool,
    signature: Signature,
}

impl RetractingExtreme {
    /// The greatest (`max`) or least value of a group's rows net of retractions.
    pub fn udaf(max: bool) -> Arc<AggregateUDF> {
        Arc::new(AggregateUDF::from(Self {
            max,
            signature: Signature::any(2, Volatility::Immutable),
        }))
    }
}

impl AggregateUDFImpl for RetractingExtreme {
    fn name(&self) -> &str {
        if self.max {
            "weir_max_retracting"
        } else {
            "weir_min_retracting"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [t, DataType::Int64] => Ok(t.clone()),
            _ => plan_err!("{} takes a value and an Int64 weight", self.name()),
        }
    }

    fn is_nullable(&self) -> bool {
        true
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let item = Arc::new(Field::new_list_field(args.return_type().clone(), true));
        let counts = Arc::new(Field::new_list_field(DataType::Int64, true));
        Ok(vec![
            Arc::new(Field::new(
                format_state_name(args.name, "values"),
                DataType::List(item),
                true,
            )),
            Arc::new(Field::new(
                format_state_name(args.name, "counts"),
                DataType::List(counts),
                true,
            )),
        ])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(ExtremeAccumulator {
            max: self.max,
            data_type: args.return_type().clone(),
            counts: HashMap::new(),
        }))
    }
}

/// A group's values, each with how many of its rows hold it (net of retractions).
#[derive(Debug)]
struct ExtremeAccumulator {
    max: bool,
    data_type: DataType,
    counts: HashMap<ScalarValue, i64>,
}

impl ExtremeAccumulator {
    /// Counts `weight` more rows holding `value`. A value's entry lasts while its count is not
    /// 0 (one below 0 is a retraction merged before its row, from another partition).
    fn add(&mut self, value: ScalarValue, weight: i64) {
        match self.counts.entry(value) {
            Entry::Occupied(mut e) => {
                *e.get_mut() += weight;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            Entry::Vacant(e) => {
                if weight != 0 {
                    e.insert(weight);
                }
            }
        }
    }
}

impl Accumulator for ExtremeAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let [x, weight] = values else {
            return exec_err!("a retracting min or max takes a value and a weight");
        };
        let Some(weight) = weight.as_any().downcast_ref::<Int64Array>() else {
            return exec_err!("a retracting min or max's weight is not Int64");
        };
        for i in 0..x.len() {
            // As min and max, nulls are not values.
            if x.is_valid(i) && weight.is_valid(i) {
                self.add(ScalarValue::try_from_array(x, i)?, weight.value(i));
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [values, counts] = states else {
            return exec_err!("a retracting min or max's state is values and counts");
        };
        let (values, counts) = (values.as_list::<i32>(), counts.as_list::<i32>());
        for row in 0..values.len() {
            if values.is_null(row) || counts.is_null(row) {
                continue;
            }
            let (v, c) = (values.value(row), counts.value(row));
            let c = c.as_primitive::<Int64Type>();
            if v.len() != c.len() {
                return exec_err!("a retracting min or max's state has unpaired values");
            }
            for i in 0..v.len() {
                self.add(ScalarValue::try_from_array(&v, i)?, c.value(i));
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let (values, counts): (Vec<ScalarValue>, Vec<ScalarValue>) = self
            .counts
            .iter()
            .map(|(v, c)| (v.clone(), ScalarValue::Int64(Some(*c))))
            .unzip();
        Ok(vec![
            ScalarValue::List(ScalarValue::new_list_nullable(&values, &self.data_type)),
            ScalarValue::List(ScalarValue::new_list_nullable(&counts, &DataType::Int64)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let mut best: Option<&ScalarValue> = None;
        for (v, c) in &self.counts {
            if *c <= 0 {
                continue;
            }
            let better = best.is_none_or(|b| match v.partial_cmp(b) {
                Some(o) => o.is_gt() == self.max && o.is_ne(),
                None => false,
            });
            if better {
                best = Some(v);
            }
        }
        match best {
            Some(v) => Ok(v.clone()),
            None => ScalarValue::try_from(&self.data_type),
        }
    }

    fn size(&self) -> usize {
        size_of_val(self)
            + self
                .counts
                .keys()
                .map(|v| v.size() + size_of::<i64>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accumulator(max: bool) -> ExtremeAccumulator {
        ExtremeAccumulator {
            max,
            data_type: DataType::Int64,
            counts: HashMap::new(),
        }
    }

    fn rows(values: &[Option<i64>], weights: &[i64]) -> Vec<ArrayRef> {
        vec![
            Arc::new(Int64Array::from(values.to_vec())),
            Arc::new(Int64Array::from(weights.to_vec())),
        ]
    }

    /// A retracted maximum falls back to the next value still held; a value held twice stays
    /// until both of its rows are taken back; nulls are not values; merged state (as from
    /// another partition or from the store) counts as the rows it came from.
    #[test]
    fn the_extreme_falls_back_when_its_rows_are_taken_back() {
        let mut max = accumulator(true);
        max.update_batch(&rows(&[Some(5), Some(9), Some(9), None], &[1, 1, 1, 1]))
            .unwrap();
        assert_eq!(max.evaluate().unwrap(), ScalarValue::Int64(Some(9)));
        max.update_batch(&rows(&[Some(9)], &[-1])).unwrap();
        assert_eq!(max.evaluate().unwrap(), ScalarValue::Int64(Some(9)));
        max.update_batch(&rows(&[Some(9)], &[-1])).unwrap();
        assert_eq!(max.evaluate().unwrap(), ScalarValue::Int64(Some(5)));

        let mut restored = accumulator(true);
        let state: Vec<ArrayRef> = max
            .state()
            .unwrap()
            .iter()
            .map(|s| s.to_array().unwrap())
            .collect();
        restored.merge_batch(&state).unwrap();
        restored
            .update_batch(&rows(&[Some(5), Some(3)], &[-1, 1]))
            .unwrap();
        assert_eq!(restored.evaluate().unwrap(), ScalarValue::Int64(Some(3)));
        restored.update_batch(&rows(&[Some(3)], &[-1])).unwrap();
        assert_eq!(restored.evaluate().unwrap(), ScalarValue::Int64(None));
        assert!(restored.counts.is_empty());

        let mut min = accumulator(false);
        min.update_batch(&rows(&[Some(5), Some(2), Some(7)], &[1, 1, 1]))
            .unwrap();
        min.update_batch(&rows(&[Some(2)], &[-1])).unwrap();
        assert_eq!(min.evaluate().unwrap(), ScalarValue::Int64(Some(5)));
    }
}
